#!/usr/bin/env python3
"""A diagnosis on the GPU machine, without gpuslice: what event timing and NVML's
per-process utilisation each say about two processes time-sliced on one GPU.

    python3 scripts/device_procutil.py OUT.json   # as root; ~40 s

Process A runs 8192^2 bf16 GEMMs one at a time with host sleeps between them (about a 30 %
duty cycle), process B runs them back to back. Each times every GEMM with a CUDA event pair and
counts them; meanwhile NVML's per-process samples (nvmlDeviceGetProcessUtilization, smUtil) are
polled. Recorded per process: GEMMs done, the sum of its event-timed durations, the mean smUtil
over the window, and the solo duration of one GEMM measured first by each process alone.
If events charge a preempted kernel for the other context's time, B's event sum exceeds
B's GEMMs x solo duration; if NVML's smUtil follows each context's own time, it does not.
"""
import ctypes, json, os, subprocess, sys, threading, time

OUT = sys.argv[1] if len(sys.argv) > 1 else "/tmp/procutil.json"
PY = os.environ.get("TORCH_PY", "/opt/torch/.venv/bin/python3")
SECS = float(os.environ.get("PROCUTIL_S", "10"))

WORKER = r'''
import json, sys, time, torch
mode, start_at, secs = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
def one():
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); torch.matmul(a, b, out=c); e.record()
    return s, e
for _ in range(20):
    torch.matmul(a, b, out=c)
torch.cuda.synchronize()
solo = []
for _ in range(10):
    s, e = one(); e.synchronize(); solo.append(s.elapsed_time(e))
while time.time() < start_at:
    time.sleep(0.001)
pairs, t0 = [], time.time()
while time.time() - t0 < secs:
    if mode == "duty":
        s, e = one(); e.synchronize(); pairs.append((s, e))
        time.sleep(0.004)
    else:
        batch = [one() for _ in range(4)]
        batch[-1][1].synchronize(); pairs.extend(batch)
torch.cuda.synchronize()
t1 = time.time()
ms = [s.elapsed_time(e) for s, e in pairs]
print(json.dumps({"mode": mode, "gemms": len(ms), "event_sum_s": sum(ms) / 1e3, "window": [t0, t1],
                  "solo_ms": sorted(solo)[len(solo) // 2]}), flush=True)
'''


class Sample(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("timeStamp", ctypes.c_ulonglong), ("smUtil", ctypes.c_uint),
                ("memUtil", ctypes.c_uint), ("encUtil", ctypes.c_uint), ("decUtil", ctypes.c_uint)]


def poll(stop, out):
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    nvml.nvmlInit_v2()
    dev = ctypes.c_void_p()
    nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev))
    last = 0
    while not stop.is_set():
        count = ctypes.c_uint(0)
        nvml.nvmlDeviceGetProcessUtilization(dev, None, ctypes.byref(count), ctypes.c_ulonglong(last))
        if count.value:
            buf = (Sample * count.value)()
            rc = nvml.nvmlDeviceGetProcessUtilization(dev, buf, ctypes.byref(count), ctypes.c_ulonglong(last))
            if rc == 0:
                for s in buf[:count.value]:
                    out.append({"pid": s.pid, "ts_us": s.timeStamp, "sm": s.smUtil})
                    last = max(last, s.timeStamp)
        stop.wait(0.05)
    nvml.nvmlShutdown()


def main():
    R = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
         "issue": 17, "window_s": SECS}
    R["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,name", "--format=csv,noheader"],
                                 capture_output=True, text=True).stdout.strip()
    start_at = time.time() + 15
    procs = {m: subprocess.Popen([PY, "-c", WORKER, m, repr(start_at), str(SECS)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for m in ("duty", "busy")}
    samples, stop = [], threading.Event()
    t = threading.Thread(target=poll, args=(stop, samples), daemon=True)
    t.start()
    res = {}
    for m, p in procs.items():
        out, err = p.communicate(timeout=90)
        lines = [l for l in out.splitlines() if l.startswith("{")]
        res[m] = json.loads(lines[-1]) if lines else {"error": err[-1000:]}
        res[m]["pid"] = p.pid
    stop.set()
    t.join(5)
    for m, r in res.items():
        if "window" not in r:
            continue
        w0, w1 = (x * 1e6 for x in r["window"])
        mine = [s for s in samples if s["pid"] == r["pid"] and w0 <= s["ts_us"] <= w1]
        r["nvml_samples"] = len(mine)
        r["nvml_mean_sm_util"] = sum(s["sm"] for s in mine) / len(mine) if mine else None
        span = r["window"][1] - r["window"][0]
        r["event_busy_fraction"] = r["event_sum_s"] / span
        r["solo_busy_fraction"] = r["gemms"] * r["solo_ms"] / 1e3 / span
    R["processes"] = res
    R["samples"] = samples[-400:]
    with open(OUT, "w") as f:
        json.dump(R, f, indent=1)
    print(json.dumps({m: {k: v for k, v in r.items() if k != "window"} for m, r in res.items()}))


if __name__ == "__main__":
    main()
