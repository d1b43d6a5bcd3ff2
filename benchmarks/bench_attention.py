"""Check and time the default workdir's attention layer on a GPU, through pytest_cudaopt's own engine."""
# Usage (from the repo root, on a CUDA machine):
#   python benchmarks/bench_attention.py [--out DIR] [--max-time S]
#   (BENCH_ATTENTION_CONFIGS=0,2 checks and times those attention configs only)
# 1. build: the workdir's cuda_extension (pytest_cudaopt.extension, the plugin's build).
# 2. check: per shape and attention config (0 = tensor cores, 1 = generic), ModelNew's relative
#    L2 error against a float64 run of model.Model, beside the float32 reference's own, and its
#    precision tier (pytest_cudaopt.correctness.precision); the attention op alone against float64 attention.
# 3. time (pytest_cudaopt.perf.engine: CUDA events, cold L2, contenders interleaved): eager Model,
#    torch.compile(Model), the SDPA peer (peers.py), ModelNew with config 0 and 1, and the three
#    ops alone (c_attn linear, attention per config, c_proj linear) on the canonical shape.
# Results land in DIR/results.jsonl (DIR: --out, else $OUT, else bench-out); a table prints last.

from __future__ import annotations

import copy
import math
import os
import sys

from bench_run import ROOT, main as bench_main

CONFIGS = {0: "wgmma warp-specialised", 1: "generic", 2: "mma.sync"}
if os.environ.get("BENCH_ATTENTION_CONFIGS"):
    CONFIGS = {c: CONFIGS[c] for c in map(int, os.environ["BENCH_ATTENTION_CONFIGS"].split(","))}
# (B, T, C, H): the canonical shape, edge sizes, other head sizes (D = C / H).
SHAPES = [(16, 1024, 768, 12), (2, 1, 768, 12), (3, 77, 768, 12), (2, 100, 35, 5), (2, 257, 768, 6)]


def attention64(qkv, n_head):
    """Causal attention of a (B, T, 3C) qkv in float64, heads merged: the op's reference."""
    import torch

    B, T, C3 = qkv.shape
    q, k, v = qkv.double().view(B, T, 3, n_head, C3 // 3 // n_head).permute(2, 0, 3, 1, 4)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    att = att.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=qkv.device).tril(), float("-inf"))
    return (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C3 // 3)


def check(wd, ext, emit):
    import torch

    from pytest_cudaopt.correctness import precision

    for B, T, C, H in SHAPES:
        torch.manual_seed(B * 7919 + T)
        model = wd.reference.Model(C, H).cuda().eval()
        model64 = copy.deepcopy(model).double()
        x = torch.randn(B, T, C, device="cuda")
        with torch.no_grad():
            ref32, ref64 = model(x), model64(x.double())
            ref_err = precision.relative_l2_error(ref32, ref64)
            qkv = ext.linear(x, model.c_attn.weight, model.c_attn.bias)
            for config in CONFIGS:
                new = wd.candidate.ModelNew(C, H).cuda().eval()
                new.load_state_dict(model.state_dict())
                new.attention_config = config
                err = precision.relative_l2_error(new(x), ref64)
                op_err = precision.relative_l2_error(ext.causal_attention(qkv, H, config), attention64(qkv, H))
                emit({"kind": "check", "shape": [B, T, C, H], "config": config, "error": err,
                      "reference_error": ref_err, "tier": precision.precision_tier(err, ref_err),
                      "attention_op_error": op_err})


def time_all(wd, ext, max_time, emit):
    import torch

    from pytest_cudaopt.perf import clocks, engine, lineup
    from pytest_cudaopt.perf.feed import Feed

    B, T, C, H = SHAPES[0]
    torch.manual_seed(0)
    model = wd.reference.Model(C, H).cuda().eval()
    x = torch.randn(B, T, C, device="cuda")
    contenders = [engine.Contender("eager", model, "Model (eager)", scope=lineup.fp32_strict)]
    compiled, seconds = lineup.compile_model(model, [x], "cuda")
    emit({"kind": "compile", "seconds": seconds})
    contenders.append(engine.Contender("compile", compiled, "torch.compile", scope=lineup.fp32_strict))
    for name, factory in lineup.load_peer_factories(ROOT, wd.reference).items():
        peer = lineup.make_peer(name, factory, [C, H], model.state_dict(), "cuda")
        contenders.append(engine.Contender(f"peer:{name}", peer, f"peer: {name}"))
    for config, words in CONFIGS.items():
        new = wd.candidate.ModelNew(C, H).cuda().eval()
        new.load_state_dict(model.state_dict())
        new.attention_config = config
        contenders.append(engine.Contender(f"custom{config}", new, f"ModelNew config {config} ({words})"))
    with torch.no_grad():
        qkv = ext.linear(x, model.c_attn.weight, model.c_attn.bias)
        y = ext.causal_attention(qkv, H, 0)
    ops = [engine.Contender("op:c_attn", lambda _x: ext.linear(x, model.c_attn.weight, model.c_attn.bias),
                            "op linear c_attn", check=False),
           engine.Contender("op:c_proj", lambda _x: ext.linear(y, model.c_proj.weight, model.c_proj.bias),
                            "op linear c_proj", check=False)]
    ops += [engine.Contender(f"op:attention{c}", (lambda c: lambda _x: ext.causal_attention(qkv, H, c))(c),
                             f"op attention config {c}", check=False) for c in CONFIGS]
    config = engine.Config(warmup=1.0, max_time=max_time)
    for group in (contenders, ops):
        with torch.no_grad():
            measured = engine.measure(group, Feed(lambda n: [x]), clock=clocks.CudaClock(), config=config)
        for key, result in measured.results.items():
            emit({"kind": "time", "key": key, "label": result.label, "shape": [B, T, C, H],
                  "device_median_s": result.device_summary.median,
                  "latency_median_s": result.latency_summary.median, "n": len(result.samples),
                  "failure": result.failure})


def table(records) -> str:
    from pytest_cudaopt.perf.stats import format_seconds

    lines = [f"{'shape':<22}{'cfg':>4}{'error':>11}{'ref error':>11}{'op error':>11}  tier"]
    lines += [f"{str(tuple(r['shape'])):<22}{r['config']:>4}{r['error']:>11.2e}{r['reference_error']:>11.2e}"
              f"{r['attention_op_error']:>11.2e}  {r['tier']}" for r in records if r["kind"] == "check"]
    timed = [r for r in records if r["kind"] == "time"]
    compile_ = next((r["device_median_s"] for r in timed if r["key"] == "compile"), None)
    lines.append(f"\n{'contender':<34}{'device':>11}{'latency':>11}{'vs compile':>12}{'n':>6}")
    for r in timed:
        ratio = f"{compile_ / r['device_median_s']:.2f}x" if compile_ and not r["key"].startswith("op:") else "-"
        lines.append(f"{r['label']:<34}{format_seconds(r['device_median_s']):>11}"
                     f"{format_seconds(r['latency_median_s']):>11}{ratio:>12}{r['n']:>6}"
                     + (f"  FAILED: {r['failure']}" if r["failure"] else ""))
    return "\n".join(lines)


def run(ext, max_time, emit):
    from pytest_cudaopt import workdir

    wd = workdir.load_workdir(ROOT, ext)
    check(wd, ext, emit)
    time_all(wd, ext, max_time, emit)


def main(argv=None) -> int:
    return bench_main(argv, doc=__doc__, name="bench_attention", results="results.jsonl", max_time=10.0,
                      run=run, table=table)


if __name__ == "__main__":
    sys.exit(main())
