"""The default workdir's kernels on a GPU: the 3xTF32 linear op at float32 accuracy on every path it
can take (the wgmma GEMM's tile variants, tails in M, N and K, the cuBLASLt fallback), and the
fallback chosen by itself where the build has no sm_90a image."""

import json
import os
import subprocess
import sys

import pytest
import torch

from support import REPO_ROOT, subprocess_env

from pytest_cudaopt import extension as build
from pytest_cudaopt.correctness import compare, precision
from pytest_cudaopt.perf import lineup

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible")]

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
# (M, N, K): GPT-2's c_proj at a smaller batch, tails in every dimension, the smallest sizes,
# a K over a hundred k-steps, and sizes the 3xTF32 kernel does not take (K or N not a multiple of 4).
SHAPES = [(2048, 768, 768), (1000, 196, 100), (1, 2304, 768), (300, 8, 4), (129, 4, 36), (512, 384, 4100)]
FALLBACK_SHAPES = [(64, 64, 35), (33, 6, 8)]


@pytest.fixture(scope="module")
def ext():
    return build.build_extension(REPO_ROOT)


def problem(M, N, K, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed + M * 31 + N * 7 + K)
    x = torch.randn(M, K, device="cuda", generator=gen)
    w = torch.randn(N, K, device="cuda", generator=gen) / K ** 0.5
    b = torch.randn(N, device="cuda", generator=gen)
    return x, w, b


def fp32_tier(y, x, w, b):
    """(tier, error, the fp32 reference's error) of y against a float64 nn.Linear."""
    ref64 = torch.nn.functional.linear(x.double(), w.double(), b.double())
    with lineup.fp32_strict():
        ref32 = torch.nn.functional.linear(x, w, b)
    err, ref_err = precision.relative_l2_error(y, ref64), precision.relative_l2_error(ref32, ref64)
    return precision.precision_tier(err, ref_err), err, ref_err


CUBLASLT = 1  # linear's config for cuBLASLt's fp32 SGEMM; the others are the 3xTF32 GEMM's variants


@pytest.mark.parametrize("config", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("M, N, K", SHAPES)
def test_linear_is_fp32_accurate_on_every_config_and_tail(ext, M, N, K, config):
    x, w, b = problem(M, N, K)
    expected_path = "cublaslt" if config == CUBLASLT or not HOPPER else "3xtf32"
    assert ext.linear_path(x, w, b, config) == expected_path
    tier, err, ref_err = fp32_tier(ext.linear(x, w, b, config), x, w, b)
    assert tier == "fp32", f"config {config} ({expected_path}) at {(M, N, K)}: error {err:.2e}, fp32 ref {ref_err:.2e}"


@pytest.mark.parametrize("M, N, K", FALLBACK_SHAPES)
def test_linear_falls_back_to_cublaslt_where_the_3xtf32_kernel_cannot_run(ext, M, N, K):
    x, w, b = problem(M, N, K)
    assert ext.linear_path(x, w, b, 0) == "cublaslt"
    assert fp32_tier(ext.linear(x, w, b, 0), x, w, b)[0] == "fp32"


def test_linear_with_a_misaligned_input_falls_back_and_stays_right(ext):
    x, w, b = problem(256, 64, 64)
    shifted = torch.empty(256 * 64 + 1, device="cuda")[1:].view(256, 64)  # 4-byte aligned only
    shifted.copy_(x)
    assert ext.linear_path(shifted, w, b, 0) == "cublaslt"
    assert fp32_tier(ext.linear(shifted, w, b, 0), shifted, w, b)[0] == "fp32"


def test_the_weights_are_split_on_every_call_not_cached(ext):
    x, w, b = problem(512, 384, 256)
    first = ext.linear(x, w, b, 0)
    w.mul_(-0.5)  # the same tensor, new values: a cached split would give the old product
    assert fp32_tier(ext.linear(x, w, b, 0), x, w, b)[0] == "fp32"
    assert not torch.allclose(first, ext.linear(x, w, b, 0))


CHILD = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
from pytest_cudaopt import extension as build
ext = build.build_extension(sys.argv[1])
torch.manual_seed(0)
x, w, b = torch.randn(300, 96, device="cuda"), torch.randn(192, 96, device="cuda") / 10, torch.randn(192, device="cuda")
y = ext.linear(x, w, b, 0)
ref = torch.nn.functional.linear(x.double(), w.double(), b.double())
qkv = torch.randn(2, 100, 3 * 128, device="cuda")
att = ext.causal_attention(qkv, 2, 0)
q, k, v = qkv.double().view(2, 100, 3, 2, 64).permute(2, 0, 3, 1, 4)
s = (q @ k.transpose(-2, -1)) / 8.0
s = s.masked_fill(~torch.ones(100, 100, dtype=torch.bool, device="cuda").tril(), float("-inf"))
att_ref = (s.softmax(-1) @ v).transpose(1, 2).reshape(2, 100, 128)
print(json.dumps({"path": ext.linear_path(x, w, b, 0),
                  "error": float((y.double() - ref).norm() / ref.norm()),
                  "attention_error": float((att.double() - att_ref).norm() / att_ref.norm())}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not HOPPER, reason="the sm_90a probe is tested on a Hopper GPU")
def test_a_build_without_an_sm_90a_image_takes_the_fallback_paths_by_itself(tmp_path):
    # compute_80 PTX, JIT-compiled for the Hopper GPU: no sm_90a code, so the probe says no.
    env = dict(subprocess_env(), TORCH_CUDA_ARCH_LIST="8.0+PTX", CUDAOPT_BUILD_DIR=str(tmp_path / "build"),
               CUDA_CACHE_PATH=str(tmp_path / "jit-cache"))
    done = subprocess.run([sys.executable, "-c", CHILD, str(REPO_ROOT)], env=env, capture_output=True, text=True,
                          timeout=1200, cwd=os.fspath(tmp_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["path"] == "cublaslt"
    assert result["error"] < 1e-5
    assert result["attention_error"] < 1e-5  # config 0 without the sm_90a kernel: mma.sync


def attention64(qkv, n_head):
    """Causal attention of a (B, T, 3C) qkv in float64, heads merged."""
    B, T, C3 = qkv.shape
    q, k, v = qkv.double().view(B, T, 3, n_head, C3 // 3 // n_head).permute(2, 0, 3, 1, 4)
    att = (q @ k.transpose(-2, -1)) / (q.size(-1) ** 0.5)
    att = att.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=qkv.device).tril(), float("-inf"))
    return (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C3 // 3)


# (B, T, C, H): D = 64 at the canonical T, tails of the 128-row and 64-key tiles (at T = 129 the
# second 64 rows of the last query tile are all past T), one row, a long sequence; D = 32 (the
# mma.sync kernel for every config). More work items than SMs, so the persistent kernel's blocks
# take several (the snake order, the producer running ahead into the next item): items of one
# key tile each (T = 64), and items with tails (T = 200).
ATTENTION_SHAPES = [(2, 1024, 768, 12), (3, 77, 128, 2), (1, 129, 64, 1), (2, 1, 256, 4), (1, 2049, 128, 2),
                    (2, 300, 128, 4), (24, 64, 768, 12), (8, 200, 768, 12)]
# 0: the warp-specialised wgmma kernel on a Hopper GPU with the sm_90a build (mma.sync elsewhere),
# 2: the mma.sync kernel everywhere.
ATTENTION_CONFIGS = [0, 2]


@pytest.mark.parametrize("config", ATTENTION_CONFIGS)
@pytest.mark.parametrize("B, T, C, H", ATTENTION_SHAPES)
def test_attention_is_fp32_accurate_on_every_config_and_tail(ext, B, T, C, H, config):
    gen = torch.Generator(device="cuda").manual_seed(B * 131 + T * 7 + C)
    qkv = torch.randn(B, T, 3 * C, device="cuda", generator=gen)
    ref64 = attention64(qkv, H)
    got = ext.causal_attention(qkv, H, config)
    err = precision.relative_l2_error(got, ref64)
    # The fp32 tier of the layer (10x a float32 computation's error, or 1e-5) asks this of the op:
    # within 1e-5, the floor an fp32 flash kernel keeps at these sizes.
    assert err < 1e-5, f"config {config} at {(B, T, C, H)}: error {err:.2e} (rounding alone {precision.relative_l2_error(ref64.float(), ref64):.2e})"
    assert torch.isfinite(got).all()


@pytest.mark.parametrize("config", ATTENTION_CONFIGS)
def test_attention_is_deterministic_and_writes_every_element(ext, config):
    # Two runs on the same input agree bit for bit (a race between the producer and the consumers,
    # or between the ring slots, would move the result), and no output element is left unwritten
    # (the output is fresh memory each call; NaN-filled caching allocator blocks would show).
    gen = torch.Generator(device="cuda").manual_seed(7)
    qkv = torch.randn(12, 333, 3 * 768, device="cuda", generator=gen)
    torch.full((12, 333, 768), float("nan"), device="cuda")  # freed at once: NaN left in the allocator's cache
    first = ext.causal_attention(qkv, 12, config)
    second = ext.causal_attention(qkv, 12, config)
    assert torch.isfinite(first).all()
    assert torch.equal(first, second)
