"""The options table: one resolution order (command line > environment > ini > default), errors that name the source."""

from __future__ import annotations

import pytest

from pytest_cudaopt.suite import settings


def test_the_command_line_wins_over_the_environment_which_wins_over_the_ini_file():
    env = {"CUDAOPT_MIN_SPEEDUP": "1.2"}
    assert settings.resolve("min_speedup", cli="1.3", ini="1.1", env=env) == 1.3
    assert settings.resolve("min_speedup", ini="1.1", env=env) == 1.2
    assert settings.resolve("min_speedup", ini="1.1", env={}) == 1.1
    assert settings.resolve("min_speedup", env={}) == 1.05


def test_an_empty_value_falls_through_to_the_next_source():
    assert settings.resolve("timeout", cli="", env={"CUDAOPT_TIMEOUT": ""}, ini="7") == 7.0


def test_every_option_resolves_in_that_order_through_settings_resolve_all():
    resolved = settings.Settings.resolve_all(
        cli=lambda name: {"seeds": "5"}.get(name),
        ini=lambda name: {"seeds": "2", "profile": "thorough", "atol": "0.5"}.get(name),
        env={"CUDAOPT_PROFILE": "ci", "CUDAOPT_ATOL": "0.25"})
    assert (resolved.seeds, resolved.profile, resolved.atol) == (5, "ci", 0.25)
    assert resolved.rtol == settings.BY_NAME["rtol"].default


@pytest.mark.parametrize("source, kwargs, named", [
    ("command line", {"cli": "nan"}, "--cudaopt-timeout='nan'"),
    ("environment", {"env": {"CUDAOPT_TIMEOUT": "-3"}}, "environment variable CUDAOPT_TIMEOUT='-3'"),
    ("ini file", {"ini": "soon", "env": {}}, "ini option cudaopt_timeout='soon'"),
])
def test_a_bad_value_is_an_error_that_names_where_it_came_from(source, kwargs, named):
    with pytest.raises(settings.SettingError, match=named.replace("(", r"\(").replace(")", r"\)")):
        settings.resolve("timeout", **kwargs)


def test_a_bad_number_says_what_was_expected_in_the_settings_words_not_pythons():
    with pytest.raises(settings.SettingError) as info:
        settings.resolve("min_speedup", cli="abc")
    assert str(info.value) == "--cudaopt-min-speedup='abc': expected a positive number, got 'abc'"
    with pytest.raises(settings.SettingError, match="expected a positive integer, got '2.5'"):
        settings.resolve("seeds", cli="2.5")
    with pytest.raises(settings.SettingError, match="expected an integer, got 'x'"):
        settings.resolve("seed", cli="x")


def test_misspelled_ini_keys_and_options_name_the_closest_known_one():
    assert settings.unknown_ini_keys(["cudaopt_min_speedp", "cudaopt_atol", "addopts"]) == [
        "cudaopt_min_speedp (did you mean cudaopt_min_speedup?)"]
    assert settings.unknown_flags(["--cudaopt-min-speedp=2", "--cudaopt-no-trace", "-q", "--cudaopt-seed=3"]) == [
        "--cudaopt-min-speedp (did you mean --cudaopt-min-speedup?)"]
    assert settings.unknown_flags(["--cudaopt-zzzz"]) == ["--cudaopt-zzzz"]


def test_a_replay_carries_the_settings_that_change_how_a_case_is_judged():
    resolved = settings.Settings.resolve_all(env={"CUDAOPT_DEVICE": "cpu", "CUDAOPT_ATOL": "0.05",
                                                  "CUDAOPT_NONDETERMINISTIC": "true"})
    assert settings.replay_args(resolved) == " --cudaopt-device=cpu --cudaopt-atol=0.05 --cudaopt-nondeterministic"
    assert settings.replay_args(settings.Settings.resolve_all(env={})) == ""


CPU_INI = "[pytest]\ncudaopt_device = cpu\ncudaopt_seeds = 1\ncudaopt_max_examples = 2\n"


def test_true_false_settings_are_plain_flags_turned_off_with_no(pytester, run_pytest):
    pytester.makepyfile(test_flags="""
        def test_flags(cudaopt_settings):
            print("FLAGS", cudaopt_settings.nondeterministic, cudaopt_settings.trace)
    """)
    result = run_pytest(pytester, "-s", "--cudaopt-nondeterministic", "--cudaopt-no-trace")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*FLAGS True False*"])
    result = run_pytest(pytester, "-s", "--cudaopt-trace")
    result.stdout.fnmatch_lines(["*FLAGS False True*"])


def test_a_misspelled_option_or_ini_key_stops_the_run_naming_the_closest_one(pytester, run_pytest):
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = run_pytest(pytester, "--cudaopt-min-speedp=2")
    assert result.ret == 4  # pytest's usage error
    result.stderr.fnmatch_lines(["*unknown option --cudaopt-min-speedp (did you mean --cudaopt-min-speedup?)*"])
    pytester.makeini("[pytest]\ncudaopt_min_speedp = 2\n")
    result = run_pytest(pytester)
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*unknown ini option cudaopt_min_speedp (did you mean cudaopt_min_speedup?)*"])
    (pytester.path / "tox.ini").unlink()
    pytester.makepyprojecttoml("[tool.pytest.ini_options]\ncudaopt_timout = 5\n")
    result = run_pytest(pytester)
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*unknown ini option cudaopt_timout (did you mean cudaopt_timeout?)*pyproject.toml*"])
    result = run_pytest(pytester, "-o", "cudaopt_atoll=1")
    result.stderr.fnmatch_lines(["*unknown ini option cudaopt_atoll (did you mean cudaopt_atol?)*"])


def test_a_bad_value_on_the_command_line_is_one_line_naming_the_option(pytester, run_pytest):
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = run_pytest(pytester, "--cudaopt-min-speedup=abc")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["ERROR: cudaopt: --cudaopt-min-speedup='abc': expected a positive number, got 'abc'"])
    assert "Traceback" not in result.stderr.str()


# -- the ini file of a command run outside pytest (`cudaopt build`, utils/compile.sh) ------------

def test_a_workdirs_ini_is_found_as_pytest_finds_it_from_the_workdir_up(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDAOPT_BUILD_DIR", raising=False)
    workdir = tmp_path / "repo" / "wd"
    workdir.mkdir(parents=True)
    (tmp_path / "repo" / "tox.ini").write_text("[pytest]\ncudaopt_build_dir = from-tox\n")
    (workdir / "setup.cfg").write_text("[metadata]\nname = x\n")  # no pytest section: not pytest's file
    (workdir / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    assert settings.workdir_ini(workdir) == (tmp_path / "repo" / "tox.ini", {"cudaopt_build_dir": "from-tox"})
    assert settings.workdir_settings(workdir).build_dir == "from-tox"
    (workdir / "pyproject.toml").write_text("[tool.pytest.ini_options]\ncudaopt_build_dir = 'from-pyproject'\n")
    assert settings.workdir_settings(workdir).build_dir == "from-pyproject"
    (workdir / "pytest.ini").write_text("[pytest]\n")  # pytest.ini wins in its folder, even empty
    assert settings.workdir_ini(workdir) == (workdir / "pytest.ini", {})
    assert settings.workdir_settings(workdir).build_dir is None
    monkeypatch.setenv("CUDAOPT_BUILD_DIR", "from-env")  # the environment wins over the ini file
    (workdir / "pytest.ini").write_text("[pytest]\ncudaopt_build_dir = from-ini\n")
    assert settings.workdir_settings(workdir).build_dir == "from-env"


def test_a_workdirs_ini_with_an_unknown_or_bad_cudaopt_key_is_an_error_naming_the_file(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\ncudaopt_nvcc_flag = -lineinfo\n")
    with pytest.raises(settings.SettingError, match=r"unknown ini option cudaopt_nvcc_flag \(did you mean "
                                                    r"cudaopt_nvcc_flags\?\) in .*pytest\.ini"):
        settings.workdir_settings(tmp_path)
    (tmp_path / "pytest.ini").write_text("[pytest]\ncudaopt_timeout = soon\n")
    with pytest.raises(settings.SettingError, match="ini option cudaopt_timeout='soon'"):
        settings.workdir_settings(tmp_path)
