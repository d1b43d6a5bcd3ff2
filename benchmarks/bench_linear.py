"""Check and time the default workdir's linear op (3xTF32 wgmma GEMM, cuBLASLt fallback) on a GPU."""
# Usage (from the repo root, on a CUDA machine):
#   python benchmarks/bench_linear.py [--out DIR] [--max-time S]
# 1. build: the workdir's cuda_extension (pytest_cudaopt.extension, the plugin's build).
# 2. check: per shape (GPT-2's c_attn and c_proj, then edge sizes: tails in M, N and K, tiny and
#    unaligned problems) and config (1 = cuBLASLt fp32, the others the 3xTF32 GEMM), the path
#    taken, the relative L2 error against float64 beside torch's fp32 F.linear's own, and the
#    largest element-wise error.
# 3. time (pytest_cudaopt.perf.engine: CUDA events, cold L2, contenders interleaved) at the GPT-2
#    shapes: each config and torch's F.linear (fp32, TF32 off), with the achieved TFLOP/s
#    (2MNK per call; the 3xTF32 kernel issues three times that on the tensor cores).
# Results land in DIR/results.jsonl (DIR: --out, else $OUT, else bench-out); a table prints last.

from __future__ import annotations

import sys

from bench_run import main as bench_main

CONFIGS = {0: "3xTF32 persistent, 2 k-steps/add", 1: "cuBLASLt fp32", 2: "3xTF32 persistent",
           3: "3xTF32 block/tile", 4: "3xTF32 block/tile, 2 k-steps/add"}
# (name, M, N, K): GPT-2 small at B*T = 16384, then tails and small problems.
SHAPES = [("c_attn", 16384, 2304, 768), ("c_proj", 16384, 768, 768), ("tails", 1000, 196, 100),
          ("one row", 1, 2304, 768), ("K=4", 300, 8, 4), ("N=4 K=36", 129, 4, 36),
          ("odd K (fallback)", 64, 64, 35), ("big K", 512, 384, 4100)]


def check(ext, emit):
    import torch

    from pytest_cudaopt.correctness import precision
    from pytest_cudaopt.perf import lineup

    for name, M, N, K in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(M * 31 + N * 7 + K)
        x = torch.randn(M, K, device="cuda", generator=gen)
        w = torch.randn(N, K, device="cuda", generator=gen) / K ** 0.5
        b = torch.randn(N, device="cuda", generator=gen)
        ref64 = torch.nn.functional.linear(x.double(), w.double(), b.double())
        with lineup.fp32_strict():
            ref32 = torch.nn.functional.linear(x, w, b)
        ref_err = precision.relative_l2_error(ref32, ref64)
        for config in CONFIGS:
            y = ext.linear(x, w, b, config)
            err = precision.relative_l2_error(y, ref64)
            emit({"kind": "check", "shape": name, "mnk": [M, N, K], "config": config,
                  "path": ext.linear_path(x, w, b, config), "error": err, "reference_error": ref_err,
                  "max_abs": float((y.double() - ref64).abs().max()),
                  "tier": precision.precision_tier(err, ref_err)})


def time_all(ext, max_time, emit):
    import torch

    from pytest_cudaopt.perf import clocks, engine, lineup
    from pytest_cudaopt.perf.feed import Feed

    for name, M, N, K in SHAPES[:2]:
        torch.manual_seed(0)
        x = torch.randn(M, K, device="cuda")
        w = torch.randn(N, K, device="cuda") / K ** 0.5
        b = torch.randn(N, device="cuda")
        group = [engine.Contender(f"{name}:torch", lambda _x: torch.nn.functional.linear(x, w, b),
                                  "torch F.linear fp32", scope=lineup.fp32_strict, check=False)]
        group += [engine.Contender(f"{name}:{c}", (lambda c: lambda _x: ext.linear(x, w, b, c))(c),
                                   f"linear config {c} ({words})", check=False) for c, words in CONFIGS.items()]
        with torch.no_grad():
            measured = engine.measure(group, Feed(lambda n: [x]), clock=clocks.CudaClock(),
                                      config=engine.Config(warmup=0.5, max_time=max_time))
        for key, result in measured.results.items():
            median = result.device_summary.median if result.samples else None
            emit({"kind": "time", "shape": name, "mnk": [M, N, K], "key": key, "label": result.label,
                  "device_median_s": median, "n": len(result.samples), "failure": result.failure,
                  "tflops": 2 * M * N * K / median / 1e12 if median else None})


def table(records) -> str:
    from pytest_cudaopt.perf.stats import format_seconds

    lines = [f"{'shape':<18}{'M,N,K':<18}{'cfg':>4}  {'path':<9}{'error':>10}{'fp32 ref':>10}{'max abs':>10}  tier"]
    lines += [f"{r['shape']:<18}{','.join(map(str, r['mnk'])):<18}{r['config']:>4}  {r['path']:<9}"
              f"{r['error']:>10.2e}{r['reference_error']:>10.2e}{r['max_abs']:>10.2e}  {r['tier']}"
              for r in records if r["kind"] == "check"]
    lines.append(f"\n{'shape':<8}{'contender':<50}{'device':>10}{'TFLOP/s':>9}{'n':>5}")
    for r in records:
        if r["kind"] == "time":
            lines.append(f"{r['shape']:<8}{r['label']:<34}{format_seconds(r['device_median_s']):>10}"
                         f"{(r['tflops'] or 0):>9.1f}{r['n']:>5}" + (f"  FAILED: {r['failure']}" if r["failure"] else ""))
    return "\n".join(lines)


def run(ext, max_time, emit):
    import torch

    with torch.no_grad():
        check(ext, emit)
    time_all(ext, max_time, emit)


def main(argv=None) -> int:
    return bench_main(argv, doc=__doc__, name="bench_linear", results="linear_results.jsonl", max_time=5.0,
                      run=run, table=table, echo=True,
                      failed=lambda records: any(r["kind"] == "check" and r["tier"] not in ("fp32", "exact")
                                                 for r in records))


if __name__ == "__main__":
    sys.exit(main())
