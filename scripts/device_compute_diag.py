#!/usr/bin/env python3
"""Why a GPU-time share is not a throughput share on the H200.

    python3 scripts/device_compute_diag.py OUTDIR     # GPU machine, no gpuslice involved

Plain PyTorch, no shim, so what it finds is the GPU's behaviour, not ours:
  events   cost of CUDA events around each launch: the same loop with no
           event, one event per launch, and an event pair per launch
  duty     the loop run in bursts at 25/50/75 % duty (sleeping between
           bursts), against the loop run back to back: work done per
           second of GPU time (events around each burst), with the SM clock
           and power sampled from NVML every 2 ms while it runs
Writes OUTDIR/compute-diag.json.
"""
import json, os, sys, time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nvml_sampler import Nvml  # noqa: E402
from device_common import GEMM_TENSORS, run_record, write_json  # noqa: E402

OUT = sys.argv[1] if len(sys.argv) > 1 else "/tmp"
R = run_record()


def save():
    write_json(R, os.path.join(OUT, "compute-diag.json"), indent=1)


dev = torch.device("cuda")
# The same tensors as device_compute.py's workers.
tensors = {"torch": torch, "dev": dev}
exec(GEMM_TENSORS, tensors)
a, b, c, x = (tensors[k] for k in "abcx")
LOOPS = {"gemm": lambda: torch.matmul(a, b, out=c), "small": lambda: x.mul_(1.0)}
nv = Nvml()
R["driver"] = nv.driver


def events_cost(op, secs=1.0):
    """Launches per second: no events, an end event per launch, a pair."""
    res = {}
    for mode in ("none", "end", "pair", "none2"):
        evs = [torch.cuda.Event(enable_timing=True) for _ in range(64)]
        torch.cuda.synchronize()
        n, t = 0, time.perf_counter()
        while time.perf_counter() - t < secs:
            for i in range(32):
                if mode == "pair":
                    evs[2 * i].record()
                op()
                if mode in ("end", "pair"):
                    evs[2 * i + 1].record()
            n += 32
            torch.cuda.synchronize()
        res[mode] = n / (time.perf_counter() - t)
    res["end_over_none"] = res["end"] / ((res["none"] + res["none2"]) / 2)
    res["pair_over_none"] = res["pair"] / ((res["none"] + res["none2"]) / 2)
    return res


def duty(op, pct, secs=2.0, burst_s=0.005):
    """Bursts of ~burst_s of GPU work at pct % duty. Work per GPU-second
    (events around each burst) and per wall second."""
    # Launches per burst from the back-to-back rate.
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(50):
        op()
    torch.cuda.synchronize()
    per = (time.perf_counter() - t) / 50
    k = max(1, int(burst_s / per))
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    gpu, n = 0.0, 0
    with nv:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < secs:
            s.record()
            for _ in range(k):
                op()
            e.record()
            e.synchronize()
            g = s.elapsed_time(e) / 1000
            gpu += g
            n += k
            if pct < 100:
                time.sleep(g * (100 - pct) / pct)
        wall = time.perf_counter() - t0
    return {"duty_pct": pct, "launches_per_burst": k, "ops": n, "wall_s": wall, "gpu_s": gpu,
            "ops_per_gpu_s": n / gpu, "ops_per_wall_s": n / wall, "gpu_busy_fraction": gpu / wall, **nv.summary()}


for name, op in LOOPS.items():
    for _ in range(20):
        op()
    R.setdefault("events", {})[name] = events_cost(op)
    save()
for name, op in LOOPS.items():
    rows = [duty(op, p) for p in (100, 50, 25, 75, 10, 100)]
    full = (rows[0]["ops_per_gpu_s"] + rows[-1]["ops_per_gpu_s"]) / 2
    for r in rows:
        r["work_per_gpu_s_over_full"] = r["ops_per_gpu_s"] / full
    R.setdefault("duty", {})[name] = rows
    save()
print(json.dumps(R, indent=1))
