"""`pytest -p oom_pools` (benchmarks/ on PYTHONPATH): at the judging process's first CUDA out-of-memory error, torch's
segments summed by memory pool, stream and state, written to $OUT/oom_<pid>.txt (where the memory went)."""

import os

import torch

GiB = 1 << 30


def _observer(device, alloc, device_alloc, device_free):
    path = os.path.join(os.environ.get("OUT", "."), f"oom_{os.getpid()}.txt")
    if os.path.exists(path):
        return
    segments = torch.cuda.memory_snapshot()
    lines = [f"out of memory: asked {alloc / GiB:.2f} GiB; device allocated {device_alloc / GiB:.2f}, free "
             f"{device_free / GiB:.2f}; {len(segments)} segments"]
    groups: dict = {}
    for seg in segments:
        key = (str(seg.get("segment_pool_id")), seg["stream"], seg["segment_type"])
        group = groups.setdefault(key, {"segments": 0, "total": 0, "largest free": 0})
        group["segments"] += 1
        group["total"] += seg["total_size"]
        for block in seg["blocks"]:
            group[block["state"]] = group.get(block["state"], 0) + block["size"]
            if block["state"] == "inactive":
                group["largest free"] = max(group["largest free"], block["size"])
    for (pool, stream, kind), group in sorted(groups.items(), key=lambda kv: -kv[1]["total"]):
        sizes = " ".join(f"{name} {value / GiB:.2f} GiB" for name, value in group.items() if name != "segments")
        lines.append(f"pool {pool} stream {stream} {kind}: {group['segments']} segments, {sizes}")
    with open(path, "w") as out:
        out.write("\n".join(lines) + "\n")


def pytest_configure(config):
    if torch.cuda.is_available():
        torch._C._cuda_attach_out_of_memory_observer(_observer)
