"""Build, check and time the default workdir's attention layer on a GPU: every kernel config."""
# Usage (from the repo root, on a CUDA machine):
#   PYTHONUNBUFFERED=1 python benchmarks/bench_attention.py --out OUT_DIR [--configs 1,2,...]
# Steps, each in a child process so that a kernel fault ends only that step (a faulting config is
# recorded and the check resumes with the next config in a fresh process):
#   build  -> the workdir's cuda_extension (pytest_cudaopt.build when it works, else cpp_extension)
#   check  -> per config and shape: error vs a float64 run of model.Model, next to the float32
#             reference's own error; the attention op alone vs float64; NaN-poisoned output memory;
#             two runs bit-identical
#   time   -> CUDA events, L2 flushed before every run, contenders interleaved, medians:
#             eager, torch.compile, the SDPA peer, ModelNew per config, and the three ops alone
#   sanitize (optional) -> compute-sanitizer memcheck/racecheck on small shapes
# Everything lands in OUT_DIR (bench.log, results.jsonl); the summary table is printed last.

from __future__ import annotations

import argparse
import datetime as dt
import glob
import importlib.util
import json
import math
import os
import platform
import site
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # pytest_cudaopt runs from the checkout, uninstalled
    sys.path.insert(0, str(ROOT))
CONFIG_NAMES = {
    0: "default (= 9)",
    1: "mma 64x64 w4",
    2: "mma 128x64 w8",
    3: "mma 128x64 w4x2slab",
    4: "mma 64x32 w4 3stage",
    5: "mma 64x64 w4 occ3",
    6: "ffma 64x64",
    7: "generic",
    8: "mma 64x64 w4, per-tile PV",
    9: "mma 128x32 w4x2slab 3stage, per-tile PV",
    10: "mma 128x32 w4x2slab 2stage, per-tile PV",
}
# (B, T, C, H): canonical, edge sizes, every head-size path (D = C / H).
SHAPES = [
    (16, 1024, 768, 12),
    (2, 1, 768, 12),
    (3, 77, 768, 12),
    (1, 1024, 768, 12),
    (4, 129, 768, 12),
    (1, 2049, 768, 12),
    (1, 4096, 768, 12),   # long T: does the error grow with T?
    (2, 100, 35, 5),      # D = 7
    (2, 130, 64, 2),      # D = 32
    (2, 333, 768, 8),     # D = 96
    (2, 257, 768, 6),     # D = 128
    (1, 50, 768, 1),      # D = 768
    (1, 40, 1100, 1),     # D = 1100: accumulator in y
]
SMALL_SHAPES = [(2, 77, 768, 12), (1, 130, 64, 2), (1, 33, 35, 5)]


# ---------------------------------------------------------------------------------------------
# Build
# ---------------------------------------------------------------------------------------------

def _nvidia_dirs(leaf: str, pattern: str) -> list[str]:
    """Folders under the nvidia-* wheels (any site-packages) that hold `pattern`."""
    found = []
    for sp in site.getsitepackages() + [site.getusersitepackages()]:
        for d in glob.glob(os.path.join(sp, "nvidia", "*", leaf)):
            if glob.glob(os.path.join(d, pattern)):
                found.append(d)
    return found


def build_with_cpp_extension(verbose: bool):
    # cpp_extension reads CUDA_HOME when imported; a wrapper nvcc on PATH would mislead its guess.
    cuda_home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    os.environ["CUDA_HOME"] = cuda_home
    from torch.utils.cpp_extension import load

    includes = [str(ROOT)]
    ldflags = []
    if not os.path.exists(os.path.join(cuda_home, "include", "cublasLt.h")):
        includes += _nvidia_dirs("include", "cublasLt.h")[:1]
    lib_dirs = [os.path.join(cuda_home, "lib64")] if glob.glob(os.path.join(cuda_home, "lib64", "libcublasLt.so*")) else []
    lib_dirs += _nvidia_dirs("lib", "libcublasLt.so*")[:1]
    for d in lib_dirs[:1]:
        for lib in ("libcublasLt.so*", "libcublas.so*"):
            cands = sorted(glob.glob(os.path.join(d, lib)), key=len)
            if cands:
                ldflags.append(cands[0])
        ldflags.append(f"-Wl,-rpath,{d}")
    sources = [str(ROOT / "binding.cpp")] + sorted(str(p) for p in (ROOT / "kernels").glob("*.cu")) + sorted(
        str(p) for p in (ROOT / "kernels").glob("*.cpp"))
    build_dir = ROOT / ".cudaopt" / "bench-build"
    build_dir.mkdir(parents=True, exist_ok=True)
    arch = os.environ.get("BENCH_ARCH", "90")
    return load(
        name="cuda_extension",
        sources=sources,
        extra_include_paths=includes,
        extra_cflags=["-O3"],
        extra_cuda_cflags=["-O3", "-std=c++17", f"-gencode=arch=compute_{arch},code=sm_{arch}", "-Xptxas=-v"],
        extra_ldflags=ldflags,
        build_directory=str(build_dir),
        verbose=verbose,
    )


def load_extension(verbose: bool = False):
    """The workdir's cuda_extension, registered as `cuda_extension` for model_new.py."""
    ext, how = None, None
    if os.environ.get("BENCH_BUILD", "auto") != "cpp_extension":
        try:
            from pytest_cudaopt import build as cbuild

            ext = cbuild.build_extension(ROOT, verbose=verbose)
            how = "pytest_cudaopt.build"
        except Exception as exc:  # the build module is optional here; say why it was not used
            print(f"[build] pytest_cudaopt.build not used: {type(exc).__name__}: {str(exc)[:300]}")
    if ext is None:
        ext = build_with_cpp_extension(verbose)
        how = "torch.utils.cpp_extension.load"
    sys.modules["cuda_extension"] = ext
    return ext, how


def import_file(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------------------------------------
# Check
# ---------------------------------------------------------------------------------------------

def rel_l2(a, b) -> float:
    import torch

    a64, b64 = a.double(), b.double()
    return float(torch.linalg.vector_norm(a64 - b64) / torch.linalg.vector_norm(b64).clamp_min(1e-300))


def attention_reference(qkv, n_head: int):
    """y (B, T, C) from qkv (B, T, 3C) in qkv's dtype, written like model.py."""
    import torch

    B, T, C3 = qkv.shape
    C = C3 // 3
    D = C // n_head
    q, k, v = qkv.split(C, dim=2)
    q = q.view(B, T, n_head, D).transpose(1, 2)
    k = k.view(B, T, n_head, D).transpose(1, 2)
    v = v.view(B, T, n_head, D).transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool, device=qkv.device))
    att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    return (att @ v).transpose(1, 2).contiguous().view(B, T, C)


def check_config(ext, ref_mod, new_mod, config: int, shapes, emit) -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    for si, (B, T, C, H) in enumerate(shapes):
        t0 = time.perf_counter()
        torch.manual_seed(1000 + 17 * si + config)
        ref32 = ref_mod.Model(C, H).to(dev).eval()
        ref64 = ref_mod.Model(C, H).to(dev).double().eval()
        ref64.load_state_dict(ref32.state_dict())
        cand = new_mod.ModelNew(C, H).to(dev).eval()
        cand.load_state_dict(ref32.state_dict(), strict=True)
        cand.attention_config = config
        x = torch.randn(B, T, C, device=dev)
        with torch.no_grad():
            e64 = ref64(x.double())
            e32 = ref32(x)
            out = cand(x)
            out2 = cand(x)
            # The attention op alone, on our own c_attn output; its output memory poisoned first.
            qkv = ext.linear(x, cand.c_attn.weight, cand.c_attn.bias)
            poison = torch.full((B, T, C), float("nan"), device=dev)
            del poison
            y = ext.causal_attention(qkv, H, config)
            y64 = attention_reference(qkv.double(), H)
            y32 = attention_reference(qkv, H)
        torch.cuda.synchronize()
        tol_ok = bool(torch.allclose(out.double(), e64, atol=1e-2, rtol=1e-2))
        rec = {
            "kind": "check", "config": config, "shape": [B, T, C, H], "D": C // H,
            "model_err": rel_l2(out, e64), "model_err_fp32ref": rel_l2(e32, e64),
            "model_maxabs": float((out.double() - e64).abs().max()),
            "model_maxabs_fp32ref": float((e32.double() - e64).abs().max()),
            "attn_err": rel_l2(y, y64), "attn_err_fp32ref": rel_l2(y32, y64),
            "attn_maxabs": float((y.double() - y64).abs().max()),
            "nan_free": bool(torch.isfinite(y).all() and torch.isfinite(out).all()),
            "deterministic": bool(torch.equal(out, out2)),
            "allclose_1e-2": tol_ok,
            "seconds": round(time.perf_counter() - t0, 2),
        }
        rec["attn_err_ratio"] = rec["attn_err"] / max(rec["attn_err_fp32ref"], 1e-30)
        # The plugin's fp32 tier (pytest_cudaopt/compare.py): within 10x the fp32 reference's
        # error against float64, or under 1e-5.
        rec["fp32_tier"] = rec["model_err"] <= max(10 * rec["model_err_fp32ref"], 1e-5)
        rec["passed"] = bool(tol_ok and rec["nan_free"] and rec["deterministic"] and rec["fp32_tier"])
        emit(rec)
        del ref32, ref64, cand, x, e64, e32, out, out2, qkv, y, y64, y32
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# Time
# ---------------------------------------------------------------------------------------------

def time_contenders(fns: dict, rounds: int, inputs: list, flush) -> dict:
    """Median ms per contender: interleaved, L2 flushed before each run, inputs rotated."""
    import torch

    for fn in fns.values():  # warm-up: lazy init, heuristics, compiled graphs
        for x in inputs:
            fn(x)
    torch.cuda.synchronize()
    events = {name: [] for name in fns}
    for r in range(rounds):
        x = inputs[r % len(inputs)]
        for name, fn in fns.items():
            flush()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn(x)
            end.record()
            events[name].append((start, end))
    torch.cuda.synchronize()
    out = {}
    for name, evs in events.items():
        ts = sorted(s.elapsed_time(e) for s, e in evs)
        n = len(ts)
        out[name] = {"median_ms": ts[n // 2], "q1_ms": ts[n // 4], "q3_ms": ts[(3 * n) // 4], "n": n}
    return out


def time_all(ext, ref_mod, new_mod, peers_mod, configs, emit, rounds: int) -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    B, T, C, H = ref_mod.batch_size, ref_mod.seq_len, ref_mod.n_embd, ref_mod.n_head
    torch.manual_seed(0)
    model = ref_mod.Model(C, H).to(dev).eval()
    sd = model.state_dict()
    peer = peers_mod.SdpaAttention(C, H).to(dev).eval()
    peer.load_state_dict(sd)
    cand = new_mod.ModelNew(C, H).to(dev).eval()
    cand.load_state_dict(sd)
    inputs = [torch.randn(B, T, C, device=dev) for _ in range(3)]
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    flush_buf = torch.empty(max(2 * l2, 256 << 20) // 4, dtype=torch.float32, device=dev)
    flush = flush_buf.zero_

    t0 = time.perf_counter()
    compiled = torch.compile(model)
    with torch.no_grad():
        compiled(inputs[0])
        torch.cuda.synchronize()
    compile_s = time.perf_counter() - t0
    emit({"kind": "info", "compile_seconds": round(compile_s, 1)})

    def model_new_with(cfg):
        def run(x):
            cand.attention_config = cfg
            return cand(x)
        return run

    qkv0 = ext.linear(inputs[0], model.c_attn.weight, model.c_attn.bias)
    y0 = ext.causal_attention(qkv0, H, 0)
    fns = {
        "eager": model,
        "torch.compile": compiled,
        "sdpa peer": peer,
    }
    for cfg in configs:
        fns[f"ModelNew cfg{cfg}"] = model_new_with(cfg)
    with torch.no_grad():
        res = time_contenders(fns, rounds, inputs, flush)
    # The ops alone (inputs fixed: qkv0 / y0 of the canonical shape).
    ops = {
        "op linear c_attn": lambda _x: ext.linear(inputs[0], model.c_attn.weight, model.c_attn.bias),
        "op torch F.linear c_attn": lambda _x: torch.nn.functional.linear(inputs[0], model.c_attn.weight,
                                                                          model.c_attn.bias),
        "op linear c_proj": lambda _x: ext.linear(y0, model.c_proj.weight, model.c_proj.bias),
    }
    for cfg in configs:
        ops[f"op attention cfg{cfg}"] = (lambda c: (lambda _x: ext.causal_attention(qkv0, H, c)))(cfg)
    with torch.no_grad():
        qv = qkv0.view(B, T, 3, H, C // H)
        q, k, v = (qv[:, :, i].transpose(1, 2) for i in range(3))
        ops["op torch sdpa (flash/eff, fp32)"] = lambda _x: torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True)
        res.update(time_contenders(ops, rounds, [None], flush))
    flops_attn = 2 * 2 * B * H * T * T * (C // H) / 2
    flops = {"op linear c_attn": 2 * B * T * C * 3 * C, "op torch F.linear c_attn": 2 * B * T * C * 3 * C,
             "op linear c_proj": 2 * B * T * C * C}
    for name, r in res.items():
        f = flops.get(name, flops_attn if "attention" in name or "sdpa (" in name else None)
        r["tflops"] = (f / (r["median_ms"] * 1e-3) / 1e12) if f else None
        emit({"kind": "time", "name": name, **r})


# ---------------------------------------------------------------------------------------------
# Child entry
# ---------------------------------------------------------------------------------------------

def child(args) -> int:
    out = Path(args.out)
    jsonl = out / "results.jsonl"

    def emit(rec):
        line = json.dumps(rec)
        print("RESULT " + line, flush=True)
        with open(jsonl, "a") as f:
            f.write(line + "\n")

    ext, how = load_extension(verbose=(args.child == "build"))
    if args.child == "build":
        import torch

        emit({"kind": "info", "build": how, "torch": torch.__version__, "cuda": torch.version.cuda,
              "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
              "python": platform.python_version(), "date": dt.date.today().isoformat()})
        return 0
    ref_mod = import_file("ref_model", ROOT / "model.py")
    new_mod = import_file("ref_model_new", ROOT / "model_new.py")
    configs = [int(c) for c in args.configs.split(",") if c != ""]
    if args.child == "check":
        shapes = SMALL_SHAPES if args.small else SHAPES
        for cfg in configs:
            emit({"kind": "check-start", "config": cfg})
            check_config(ext, ref_mod, new_mod, cfg, shapes, emit)
            emit({"kind": "check-done", "config": cfg})
        return 0
    if args.child == "time":
        peers_mod = import_file("ref_peers", ROOT / "peers.py")
        time_all(ext, ref_mod, new_mod, peers_mod, configs, emit, args.rounds)
        return 0
    raise SystemExit(f"unknown child step {args.child}")


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------

def run_step(argv: list[str], log, timeout: float, prefix: list[str] | None = None) -> int:
    cmd = (prefix or []) + [sys.executable, str(Path(__file__).resolve())] + argv
    log.write(f"\n$ {' '.join(cmd)}\n")
    log.flush()
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
                              cwd=ROOT)
        text, rc = proc.stdout, proc.returncode
    except subprocess.TimeoutExpired as exc:
        text = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        rc = 124
    log.write(text)
    log.write(f"[rc={rc}, {time.perf_counter() - t0:.1f}s]\n")
    log.flush()
    lines = [ln for ln in text.splitlines() if not ln.startswith("RESULT ")]
    tail = "\n".join(lines[-25:])
    print(f"[{argv[1] if len(argv) > 1 else argv}] rc={rc} in {time.perf_counter() - t0:.1f}s")
    if rc != 0:
        print(tail)
    return rc


def read_results(out: Path) -> list[dict]:
    path = out / "results.jsonl"
    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def summary(out: Path) -> str:
    recs = read_results(out)
    lines = []
    info = {}
    for r in recs:
        if r["kind"] == "info":
            info.update({k: v for k, v in r.items() if k != "kind"})
    lines.append("info: " + ", ".join(f"{k}={v}" for k, v in info.items()))
    checks = [r for r in recs if r["kind"] == "check"]
    faults = [r for r in recs if r["kind"] == "fault"]
    lines.append("")
    lines.append(f"{'cfg':>3} {'shape (B,T,C,H)':<22} {'D':>4} {'attn err':>9} {'fp32 ref':>9} {'ratio':>7} "
                 f"{'model err':>9} {'fp32 ref':>9} {'maxabs':>8} {'ok':>3}")
    for r in checks:
        lines.append(f"{r['config']:>3} {str(tuple(r['shape'])):<22} {r['D']:>4} {r['attn_err']:9.2e} "
                     f"{r['attn_err_fp32ref']:9.2e} {min(r['attn_err_ratio'], 999.0):7.2f} {r['model_err']:9.2e} "
                     f"{r['model_err_fp32ref']:9.2e} {r['model_maxabs']:8.1e} {'yes' if r['passed'] else 'NO'}")
    for r in faults:
        lines.append(f"FAULT config {r['config']}: {r['message'][:300]}")
    per_cfg = {}
    for r in checks:
        per_cfg.setdefault(r["config"], []).append(r["passed"])
    lines.append("")
    lines.append("config verdicts: " + ", ".join(
        f"{c}={'PASS' if all(v) else 'FAIL'}({sum(v)}/{len(v)})" for c, v in sorted(per_cfg.items())))
    times = [r for r in recs if r["kind"] == "time"]
    if times:
        base = {r["name"]: r["median_ms"] for r in times}
        comp = base.get("torch.compile")
        sdpa = base.get("sdpa peer")
        lines.append("")
        lines.append(f"{'contender':<34} {'median ms':>10} {'IQR ms':>14} {'n':>4} {'TFLOP/s':>8} "
                     f"{'vs compile':>10} {'vs sdpa':>8}")
        for r in times:
            tf = f"{r['tflops']:.1f}" if r.get("tflops") else ""
            vc = f"{comp / r['median_ms']:.2f}x" if comp and not r["name"].startswith("op ") else ""
            vs = f"{sdpa / r['median_ms']:.2f}x" if sdpa and not r["name"].startswith("op ") else ""
            lines.append(f"{r['name']:<34} {r['median_ms']:10.3f} {r['q1_ms']:6.3f}-{r['q3_ms']:<7.3f} "
                         f"{r['n']:>4} {tf:>8} {vc:>10} {vs:>8}")
    return "\n".join(lines)


def driver(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.jsonl").unlink(missing_ok=True)
    t_start = time.perf_counter()
    budget = args.budget
    configs = [int(c) for c in args.configs.split(",")]
    with open(out / "bench.log", "a") as log:
        if run_step(["--child", "build", "--out", str(out)], log, timeout=budget * 0.5) != 0:
            print("build failed; see bench.log")
            print(summary(out))
            return 1
        # Checks: resume after a fault in a fresh process, recording the faulting config.
        todo = list(configs)
        while todo:
            left = budget - (time.perf_counter() - t_start)
            if left < 60:
                print(f"check: out of time budget, not checked: {todo}")
                break
            rc = run_step(["--child", "check", "--out", str(out), "--configs", ",".join(map(str, todo))], log,
                          timeout=min(left - 30, 300))
            done = {r["config"] for r in read_results(out) if r["kind"] == "check-done"}
            started = [r["config"] for r in read_results(out) if r["kind"] == "check-start"]
            if rc == 0:
                break
            culprit = next((c for c in reversed(started) if c not in done), todo[0])
            with open(out / "results.jsonl", "a") as f:
                f.write(json.dumps({"kind": "fault", "config": culprit, "message": f"child exited rc={rc}"}) + "\n")
            todo = [c for c in todo if c not in done and c != culprit]
        good = sorted({r["config"] for r in read_results(out) if r["kind"] == "check-done"} -
                      {r["config"] for r in read_results(out) if r["kind"] == "fault"})
        wanted = [int(c) for c in args.time_configs.split(",")] if args.time_configs else configs
        time_cfgs = [c for c in wanted if c in good and c != 7]
        left = budget - (time.perf_counter() - t_start)
        if time_cfgs and left > 90:
            run_step(["--child", "time", "--out", str(out), "--configs", ",".join(map(str, time_cfgs)),
                      "--rounds", str(args.rounds)], log, timeout=left - 30)
        left = budget - (time.perf_counter() - t_start)
        if args.sanitize and left > 100:
            for tool in ("memcheck", "racecheck"):
                left = budget - (time.perf_counter() - t_start)
                if left < 60:
                    break
                cfgs = args.sanitize_configs if tool == "memcheck" else args.sanitize_configs.split(",")[0]
                rc = run_step(["--child", "check", "--small", "--out", str(out / f"sanitize_{tool}"),
                               "--configs", cfgs], log, timeout=left - 20,
                              prefix=["compute-sanitizer", f"--tool={tool}", "--error-exitcode=99",
                                      "--print-limit=20"])
                with open(out / "results.jsonl", "a") as f:
                    f.write(json.dumps({"kind": "info", f"sanitize_{tool}": f"configs {cfgs}: rc={rc}"}) + "\n")
    text = summary(out)
    (out / "summary.txt").write_text(text + "\n")
    print(f"\ntotal {time.perf_counter() - t_start:.0f}s")
    print(text)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default=str(ROOT / "out"))
    p.add_argument("--configs", default="1,2,3,4,5,6,7,8,9,10,0")
    p.add_argument("--time-configs", default=None, help="configs to time (default: every passing one)")
    p.add_argument("--child", default=None)
    p.add_argument("--small", action="store_true")
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--budget", type=float, default=420.0, help="seconds for the whole driver run")
    p.add_argument("--sanitize", action="store_true")
    p.add_argument("--sanitize-configs", default="0,6,7")
    args = p.parse_args()
    if args.child:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        return child(args)
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
