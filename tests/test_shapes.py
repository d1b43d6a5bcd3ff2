"""shapes.py: constants found in KernelBench files, declared shapes, meta-device checks, profiles."""

import textwrap
import types

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from pytest_cudaopt.correctness import shapes


def module_from(source: str, name: str = "model_under_test") -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = f"/work/{name}.py"
    exec(compile(textwrap.dedent(source), module.__file__, "exec"), module.__dict__)
    return module


KERNELBENCH = textwrap.dedent("""
    import torch
    import torch.nn as nn

    batch_size = 16
    n_head = 4
    n_embd = 64
    dropout = 0.0      # a float: not varied
    use_bias = True    # a bool: not varied
    unrelated = 99     # not read by get_inputs/get_init_inputs

    def _shape():
        return (batch_size, n_embd)

    class Model(nn.Module):
        def __init__(self, n_embd, n_head):
            super().__init__()
            assert n_embd % n_head == 0, "n_embd must be a multiple of n_head"
            self.proj = nn.Linear(n_embd, n_embd)
            self.n_head = n_head

        def forward(self, x):
            return self.proj(x)

    def get_inputs():
        return [torch.randn(*_shape())]

    def get_init_inputs():
        return [n_embd, n_head]
""")


def test_it_infers_the_int_constants_that_get_inputs_and_get_init_inputs_read():
    module = module_from(KERNELBENCH)
    # batch_size is read through the helper _shape(); floats, bools and unread names are not.
    assert shapes.infer_constants(module) == {"batch_size": 16, "n_head": 4, "n_embd": 64}


def test_constants_read_inside_a_comprehension_are_found():
    module = module_from("""
        import torch
        count = 3
        size = 5
        def get_inputs():
            return [torch.randn(size) for _ in range(count)]
        def get_init_inputs():
            return []
    """)
    assert shapes.infer_constants(module) == {"count": 3, "size": 5}


def test_applied_sets_the_constants_and_restores_them():
    module = module_from(KERNELBENCH)
    with shapes.applied(module, {"batch_size": 3}):
        assert module.get_inputs()[0].shape == (3, 64)
    assert module.batch_size == 16
    with pytest.raises(shapes.ShapeError, match="defines no constant nope"):
        with shapes.applied(module, {"nope": 1}):
            pass


def test_the_meta_device_accepts_valid_shapes_and_rejects_invalid_ones():
    module = module_from(KERNELBENCH)
    ok = shapes.check_on_meta(module, {"batch_size": 7, "n_embd": 12, "n_head": 3})
    assert ok.valid and ok.shapes == [(7, 12)] and ok.elements == 84
    bad = shapes.check_on_meta(module, {"n_embd": 10, "n_head": 3})
    assert not bad.valid and "n_embd must be a multiple of n_head" in bad.reason
    assert module.n_embd == 64  # restored after a failing check too


@given(st.data())
@hsettings(max_examples=60, deadline=None)
def test_drawn_sizes_stay_between_1_and_twice_the_default(data):
    default = data.draw(st.integers(1, 5000))
    value = data.draw(shapes.around(default))
    assert 1 <= value <= max(2 * default, 8)


def test_drawn_sizes_include_edge_sizes_around_the_default():
    seen = set()

    @given(shapes.around(256))
    @hsettings(max_examples=300, deadline=None, derandomize=True, database=None)
    def collect(value):
        seen.add(value)

    collect()
    assert 256 in seen and 1 in seen
    assert {255, 257} & seen                       # just off the multiple of 32/128
    assert max(seen) > 256 and all(1 <= v <= 512 for v in seen)  # past the default, within 2x
    assert {127, 129, 31, 33, 251, 509} & seen     # primes and off-by-one sizes


def test_the_inferred_space_names_its_constants_and_caps_the_elements():
    space = shapes.shape_space(module_from(KERNELBENCH))
    assert space.strategy is not None and not space.declared
    assert space.source == "inferred from batch_size=16, n_head=4, n_embd=64"
    assert space.canonical_elements == 16 * 64
    assert space.max_elements == 4096  # max(2 * 1024, 4096)
    assert shapes.shape_space(module_from(KERNELBENCH), max_elements=100).max_elements == 100


def test_declared_ranges_lists_and_ranges_are_drawn_as_declared():
    module = module_from(KERNELBENCH + textwrap.dedent("""
    CUDAOPT_SHAPES = {"batch_size": (1, 4), "n_head": [2, 4], "n_embd": range(8, 33, 8)}
    """))
    space = shapes.shape_space(module)
    assert space.declared and "declared by CUDAOPT_SHAPES" in space.source
    drawn = []

    @given(space.strategy)
    @hsettings(max_examples=50, deadline=None, database=None)
    def collect(case):
        drawn.append(case)

    collect()
    assert all(set(c) == {"batch_size", "n_head", "n_embd"} for c in drawn)
    assert all(1 <= c["batch_size"] <= 4 and c["n_head"] in (2, 4) and c["n_embd"] in (8, 16, 24, 32)
               for c in drawn)


def test_a_declared_strategy_function_draws_dependent_constants():
    module = module_from(KERNELBENCH + textwrap.dedent("""
    from hypothesis import strategies as st
    def CUDAOPT_SHAPES():
        return st.integers(1, 8).map(lambda h: {"n_head": h, "n_embd": 8 * h})
    """))
    space = shapes.shape_space(module)

    @given(space.strategy)
    @hsettings(max_examples=20, deadline=None, database=None)
    def check(case):
        assert case["n_embd"] == 8 * case["n_head"]
        assert shapes.check_on_meta(module, case).valid

    check()


@pytest.mark.parametrize("declaration, message", [
    ('{"nope": (1, 2)}', "names 'nope', which /work/model_under_test.py does not define"),
    ('{"batch_size": (5, 1)}', "low 5 > high 1"),
    ('{"batch_size": "big"}', "expected (low, high) (inclusive), a list of values"),
    ('[1, 2]', "must be a dict"),
])
def test_a_bad_declaration_says_what_is_wrong(declaration, message):
    module = module_from(KERNELBENCH + f"\nCUDAOPT_SHAPES = {declaration}\n")
    with pytest.raises(shapes.ShapeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        shapes.shape_space(module)


def test_an_empty_declaration_turns_the_drawn_shapes_off():
    space = shapes.shape_space(module_from(KERNELBENCH + "\nCUDAOPT_SHAPES = {}\n"))
    assert space.strategy is None and "no drawn shapes" in space.source


def test_a_module_without_constants_has_no_space_and_says_how_to_declare_one():
    space = shapes.shape_space(module_from("""
        import torch
        class Model(torch.nn.Module):
            def forward(self, x):
                return x
        def get_inputs():
            return [torch.randn(4, 4)]
        def get_init_inputs():
            return []
    """))
    assert space.strategy is None and "owner declares the shapes with CUDAOPT_SHAPES" in space.source
    assert "cudaopt init --lock-only" in space.source


def test_inputs_sampled_from_torch_distributions_are_sized_on_meta_with_argument_checks_back_after(monkeypatch):
    """KernelBench L1-94 (MSELoss) draws its 32768 x 32768 inputs from Pareto, whose argument check reads values:
    unsized, the memory plan was skipped and the canonical case's 26 GiB killed a 23 GiB host."""
    import torch

    module = module_from("""
        import torch
        from torch.distributions import Pareto
        n = 32768
        class Model(torch.nn.Module):
            def forward(self, predictions, targets):
                return torch.mean((predictions - targets) ** 2)
        def get_inputs():
            return [Pareto(0.01, 1.5).sample((n, n)), Pareto(0.01, 1.5).sample((n, n))]
        def get_init_inputs():
            return []
    """)
    # On, as in a fresh process (torch.compile's first use turns it off for good, so other tests may have)
    monkeypatch.setattr(torch.distributions.Distribution, "_validate_args", True)
    before = torch.distributions.Distribution._validate_args
    check = shapes.check_on_meta(module, {})
    assert check.valid, check.reason
    assert check.shapes == [(32768, 32768)] * 2 and check.input_bytes == 8 << 30 and check.output_bytes == 4
    assert torch.distributions.Distribution._validate_args == before
    with pytest.raises(ValueError):   # the check is on again for model.py's own runs
        torch.distributions.Pareto(torch.tensor(-1.0), torch.tensor(1.5))


def test_a_reference_that_cannot_run_on_meta_is_noted_not_fatal():
    space = shapes.shape_space(module_from("""
        import torch
        n = 8
        class Model(torch.nn.Module):
            def forward(self, x):
                return x[x > 0]     # data-dependent: no meta kernel can size it
        def get_inputs():
            return [torch.randn(n)]
        def get_init_inputs():
            return []
    """))
    assert space.strategy is not None and not space.meta_usable and space.meta_note


def test_case_text_round_trips():
    assert shapes.parse_case("batch_size=3, dim=17") == {"batch_size": 3, "dim": 17}
    assert shapes.format_case({"batch_size": 3, "dim": 17}) == "batch_size=3,dim=17"
    with pytest.raises(shapes.ShapeError, match="expected an int"):
        shapes.parse_case("dim=x")


def test_profiles_ci_is_seeded_and_modest_thorough_is_large():
    ci = shapes.hypothesis_settings("ci")
    thorough = shapes.hypothesis_settings("thorough")
    assert not ci.derandomize and ci.deadline is None and ci.database is None and 20 <= ci.max_examples <= 30
    assert not thorough.derandomize and thorough.max_examples >= 200
    assert shapes.hypothesis_settings("ci", max_examples=7).max_examples == 7


def test_explicit_cases_go_past_every_default_and_down_to_the_smallest_valid_value():
    module = module_from(KERNELBENCH)
    space = shapes.shape_space(module)
    found = shapes.explicit_cases(module, space)
    assert found.never_above == []
    for name, default in space.defaults.items():
        values = [case[name] for case in found.cases]
        assert any(v > default for v in values), name
        assert all(shapes.check_on_meta(module, case).valid for case in found.cases)
        others = [case for case in found.cases if case[name] != default]
        assert all(case[k] == space.defaults[k] for case in others for k in space.defaults if k != name)
    # n_embd must stay a multiple of n_head (4): the next valid value above 64 is 68
    assert {**space.defaults, "n_embd": 68} in found.cases
    assert {**space.defaults, "batch_size": 17} in found.cases
    assert {**space.defaults, "batch_size": 1} in found.cases


def test_explicit_cases_also_move_constants_past_their_defaults_together_where_valid():
    module = module_from(KERNELBENCH)
    space = shapes.shape_space(module)
    [combined] = shapes.explicit_cases(module, space).combined
    # batch_size and n_head grow together; n_embd 68 would not divide by n_head 8, so it stays
    assert combined == {**space.defaults, "batch_size": 17, "n_head": 8}
    assert shapes.check_on_meta(module, combined).valid


def test_a_constant_that_cannot_grow_within_the_cap_is_named():
    module = module_from(KERNELBENCH)
    space = shapes.shape_space(module, max_elements=16 * 64)  # exactly the canonical inputs
    found = shapes.explicit_cases(module, space)
    assert set(found.never_above) == {"batch_size", "n_embd"}
    assert found.combined == []


def test_int_elements_of_tuple_constants_vary_one_by_one():
    module = module_from("""
        import torch
        import torch.nn as nn

        batch_size = 8
        input_shape = (16, 32)

        class Model(nn.Module):
            def forward(self, x):
                return x.sum(dim=1)

        def get_inputs():
            return [torch.randn(batch_size, *input_shape)]

        def get_init_inputs():
            return []
    """)
    assert shapes.infer_constants(module) == {"batch_size": 8, "input_shape[0]": 16, "input_shape[1]": 32}
    with shapes.applied(module, {"input_shape[1]": 33}):
        assert module.input_shape == (16, 33)
    assert module.input_shape == (16, 32)
    assert shapes.parse_case(shapes.format_case({"input_shape[0]": 17})) == {"input_shape[0]": 17}
    space = shapes.shape_space(module)
    found = shapes.explicit_cases(module, space)
    assert {"batch_size": 8, "input_shape[0]": 17, "input_shape[1]": 32} in found.cases
    assert {"batch_size": 8, "input_shape[0]": 16, "input_shape[1]": 33} in found.cases
    with pytest.raises(shapes.ShapeError, match=r"defines no constant input_shape\[2\]"):
        with shapes.applied(module, {"input_shape[2]": 1}):
            pass


def test_constants_tied_by_their_default_grow_together_where_one_alone_is_invalid():
    module = module_from("""
        import torch
        import torch.nn as nn

        batch_size = 4
        out_channels = 16
        bias_shape = (out_channels, 1)

        class Model(nn.Module):
            def __init__(self, out_channels, bias_shape):
                super().__init__()
                self.bias = nn.Parameter(torch.zeros(bias_shape))

            def forward(self, x):
                return x + self.bias

        def get_inputs():
            return [torch.randn(batch_size, out_channels, 8)]

        def get_init_inputs():
            return [out_channels, bias_shape]
    """)
    space = shapes.shape_space(module)
    found = shapes.explicit_cases(module, space)
    assert {"batch_size": 4, "out_channels": 17, "bias_shape[0]": 17, "bias_shape[1]": 1} in found.cases
    assert "bias_shape[1]" in found.never_above or any(c["bias_shape[1]"] > 1 for c in found.cases)


def test_the_profiles_are_registered_with_hypothesis_and_a_users_profile_wins():
    from hypothesis import settings as hsettings

    assert hsettings.get_profile("cudaopt-ci").max_examples == 25
    assert shapes.hypothesis_settings("thorough").max_examples == 300
    assert shapes.hypothesis_settings("ci", max_examples=7).max_examples == 7
    assert shapes.hypothesis_settings("ci").database is None
    before = hsettings.get_current_profile_name()  # "default", or "ci" where the CI variable is set
    hsettings.register_profile("a-users-profile", max_examples=3)
    hsettings.load_profile("a-users-profile")  # what --hypothesis-profile=a-users-profile does
    try:
        assert shapes.hypothesis_settings("ci").max_examples == 3
        assert shapes.hypothesis_settings("ci", max_examples=9).max_examples == 9
        hsettings.load_profile("ci")  # Hypothesis's own CI profile is not the user's choice
        assert shapes.hypothesis_settings("ci").max_examples == 25
        assert not shapes.hypothesis_settings("ci").derandomize
    finally:
        hsettings.load_profile(before)
    assert shapes.hypothesis_settings("ci").max_examples == 25


# -- constants model.py computes from others -----------------------------------------------------

LEVEL2 = textwrap.dedent("""
    import math

    import torch
    import torch.nn as nn

    batch_size = 8
    in_features = 32
    out_features = 24
    bias_shape = (out_features,)          # KernelBench level 2 writes it so
    hidden = max(1, out_features // 4) * 4
    scale = math.sqrt(in_features)        # an attribute call: not recomputed, not drawn (a float)

    class Model(nn.Module):
        def __init__(self, in_features, out_features, bias_shape):
            super().__init__()
            self.linear = nn.Linear(in_features, out_features)
            self.bias = nn.Parameter(torch.randn(bias_shape))

        def forward(self, x):
            return torch.relu(self.linear(x) + self.bias)

    def get_inputs():
        return [torch.randn(batch_size, in_features)]

    def get_init_inputs():
        return [in_features, out_features, bias_shape]
""")


def module_in_file(tmp_path, source: str, name: str = "model_in_file") -> types.ModuleType:
    """`source` as a module with a real file (derived constants are read from model.py's source)."""
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    module = types.ModuleType(name)
    module.__file__ = str(path)
    exec(compile(path.read_text(), str(path), "exec"), module.__dict__)
    return module


def test_a_constant_model_py_computes_from_others_follows_them_instead_of_being_drawn(tmp_path):
    module = module_in_file(tmp_path, LEVEL2)
    assert shapes.infer_constants(module) == {"batch_size": 8, "in_features": 32, "out_features": 24}
    # drawn on its own, bias_shape[0] = 24 with out_features = 1 broadcasts in the reference
    assert "bias_shape[0]" in shapes.infer_constants(module, follow_derived=False)
    with shapes.applied(module, {"out_features": 7}):
        assert module.bias_shape == (7,) and module.hidden == 4 and module.out_features == 7
    assert module.bias_shape == (24,) and module.hidden == 24
    space = shapes.shape_space(module)
    assert "bias_shape = (out_features,)" in space.source and "hidden = max(1, out_features // 4) * 4" in space.source
    for case in shapes.explicit_cases(module, space).cases:
        assert shapes.check_on_meta(module, case).shapes  # valid
        with shapes.applied(module, case):
            assert module.Model(*module.get_init_inputs()).bias.shape == (case["out_features"],)


def test_a_derived_constant_the_caller_names_keeps_the_value_it_is_given(tmp_path):
    module = module_in_file(tmp_path, LEVEL2)
    with shapes.applied(module, {"out_features": 7, "bias_shape[0]": 1}):  # --cudaopt-case, CUDAOPT_SHAPES
        assert module.bias_shape == (1,) and module.hidden == 4
    with shapes.applied(module, {"hidden": 5, "out_features": 2}):
        assert module.hidden == 5 and module.bias_shape == (2,)


def test_a_constant_read_only_through_a_derived_one_is_drawn(tmp_path):
    module = module_in_file(tmp_path, """
        import torch
        import torch.nn as nn

        n_embd = 16
        n_head = 4
        depth, width = 2, 3             # unpacked: constants too
        head_dim = n_embd // n_head
        shape = (depth, *(n_head, head_dim), -1 * -width)

        class Model(nn.Module):
            def forward(self, x):
                return x * 2

        def get_inputs():
            return [torch.randn(shape)]

        def get_init_inputs():
            return []
    """)
    assert shapes.infer_constants(module) == {"n_embd": 16, "n_head": 4, "depth": 2, "width": 3}
    with shapes.applied(module, {"n_embd": 40, "n_head": 5, "width": 7}):
        assert module.shape == (2, 5, 8, 7)
    assert module.shape == (2, 4, 4, 3)


@pytest.mark.parametrize("expression", ["n.bit_length()", "int(n / 2)", "(n,) * 2000", "helper(n)", "n ** 2",
                                        "min(n, 9, key=abs)"])
def test_an_expression_outside_the_safe_forms_leaves_the_constant_drawn_on_its_own(tmp_path, expression):
    module = module_in_file(tmp_path, f"""
        import torch

        def helper(v):
            return v + 1

        n = 6
        m = {expression}

        class Model(torch.nn.Module):
            def forward(self, x):
                return x

        def get_inputs():
            return [torch.randn(n, m if isinstance(m, int) else 1)]

        def get_init_inputs():
            return []
    """)
    assert "m" not in shapes.shape_space(module).derived
    with shapes.applied(module, {"n": 3}):
        assert module.m == eval(expression, {"helper": lambda v: v + 1, "n": 6})


def test_the_drawn_shapes_never_run_hypothesis_explain_phase_whatever_the_profile():
    from hypothesis import Phase, settings as hsettings

    # The explain phase re-runs the failing case under sys.settrace: a run that says nothing of a kernel.
    assert Phase.explain not in shapes.hypothesis_settings("ci").phases
    assert Phase.explain not in shapes.hypothesis_settings("thorough", max_examples=3).phases
    before = hsettings.get_current_profile_name()
    hsettings.register_profile("explaining", phases=list(Phase))
    hsettings.load_profile("explaining")
    try:
        chosen = shapes.hypothesis_settings("ci")
        assert Phase.explain not in chosen.phases and Phase.shrink in chosen.phases
    finally:
        hsettings.load_profile(before)


MASKED_CUMSUM = """
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.dim = dim

        def forward(self, x, mask):
            return torch.cumsum(x * mask, dim=self.dim)

    batch_size = 64
    input_shape = (128,)
    dim = 1

    def get_inputs():
        x = torch.rand(batch_size, *input_shape)
        return [x, torch.randint(0, 2, x.shape).bool()]

    def get_init_inputs():
        return [dim]
"""


def test_a_small_dimension_index_handed_to_the_constructor_is_drawn_below_its_default_too():
    # KernelBench level1/93: dim = 1 of a 2-d input; a kernel that hard-codes the last dimension
    # passed every case while dim was drawn only from 1 upwards (2 and more are not valid).
    module = module_from(MASKED_CUMSUM)
    space = shapes.shape_space(module)
    assert shapes.signed_constants(module, space.defaults) == {"dim"}
    found = shapes.explicit_cases(module, space)
    dims = {case["dim"] for case in found.cases}
    assert dims - {1} and all(d in (-2, -1, 0) for d in dims - {1}), found.cases
    assert {**space.defaults, "dim": -2} in found.cases
    assert found.never_above == ["dim"]


@hsettings(max_examples=200, database=None)
@given(st.data())
def test_drawn_dimension_indices_reach_zero_and_negatives_but_sizes_stay_positive(data):
    module = module_from(MASKED_CUMSUM)
    space = shapes.shape_space(module)
    drawn = data.draw(space.strategy)
    assert drawn["batch_size"] >= 1 and drawn["input_shape[0]"] >= 1
    assert drawn["dim"] >= -2


def test_a_dimension_index_takes_zero_and_negative_values_among_its_draws():
    module = module_from(MASKED_CUMSUM)
    space = shapes.shape_space(module)
    seen = set()

    @hsettings(max_examples=300, database=None)
    @given(space.strategy)
    def draw(case):
        seen.add(case["dim"])

    draw()
    assert {0, -1, -2} <= seen, seen


def test_the_meta_check_runs_once_per_module_constants_and_module_values(monkeypatch):
    module = types.ModuleType("kept")
    exec(compile("import torch\nimport torch.nn as nn\n\nbatch_size = 8\nfeatures = 4\n\n\n"
                 "class Model(nn.Module):\n    def forward(self, x):\n        return (x * 2).exp()\n\n\n"
                 "def get_inputs():\n    return [torch.randn(batch_size, features)]\n\n\n"
                 "def get_init_inputs():\n    return []\n", "model.py", "exec"), module.__dict__)
    runs = []
    run = shapes.run_on_meta
    monkeypatch.setattr(shapes, "run_on_meta", lambda *args: runs.append(args[1]) or run(*args))
    first = shapes.check_on_meta(module, {})
    first.shapes.append("changed by a caller")
    again = shapes.check_on_meta(module, {})
    assert len(runs) == 1 and again.shapes == [(8, 4)] and again.work_bytes == 8 * 4 * 4
    assert shapes.check_on_meta(module, {"batch_size": 2}).shapes == [(2, 4)] and len(runs) == 2
    with shapes.applied(module, {"batch_size": 3}):   # a drawn case's constants, applied while the check is asked
        assert shapes.check_on_meta(module, {}).shapes == [(3, 4)]
    assert shapes.check_on_meta(module, {}).shapes == [(8, 4)] and len(runs) == 3
