#!/usr/bin/env python3
"""A diagnosis: the slice ledger's bucket traced every 5 ms while one
capped PyTorch worker runs small kernels at 100 %, idles 2 s, then runs a
GEMM loop at 50 % (the sequence after which the full check saw a stall).

    python3 scripts/device_compute_trace.py OUTDIR   # after device-build.sh
Writes OUTDIR/compute-trace.json.
"""
import json, os, struct, sys, threading, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import device_compute as dc  # noqa: E402

OUT = sys.argv[1] if len(sys.argv) > 1 else "/tmp/trace"
os.makedirs(OUT, exist_ok=True)


def read(ledger):
    with open(ledger, "rb") as f:
        b = f.read()
    share, burst, tokens, last, busy, thr, launches, delayed = struct.unpack_from(
        "<QQqQQQQQ", b, dc.COMPUTE_OFF)
    return [round(time.time() - T0, 4), share, tokens, busy, thr, launches]


T0 = time.time()
env = dict(os.environ)
for k in ("LD_PRELOAD", "GPUSLICE_COMPUTE_LIMIT", "GPUSLICE_LEDGER"):
    env.pop(k, None)
env["GPUSLICE_LEDGER_DIR"] = os.path.join(OUT, "ledgers")
env["GPUSLICE_BOARD_DIR"] = os.path.join(OUT, "boards")
os.makedirs(env["GPUSLICE_LEDGER_DIR"], exist_ok=True)
argv = [dc.GPUSLICE, "run", "--gpus", "0", "--isolation", "env", "--compute", "100", "--",
        dc.PY, "-c", dc.WORKER]
R = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
     "columns": ["t", "share_bp", "tokens_ns", "busy_ns", "throttled_ns", "launches"],
     "events": [], "trace": []}
try:
    R["driver"] = dc.Nvml().driver
except Exception as e:  # noqa: BLE001
    R["driver_error"] = repr(e)
w = dc.Worker("T", argv, env)
try:
    info = w.read(60)
    ledger = info["ledger"]
    stop = False

    def poll():
        while not stop:
            R["trace"].append(read(ledger))
            time.sleep(0.005)

    th = threading.Thread(target=poll)
    th.start()
    for cmd, share in (("small 1.0", 100), ("idle", 100), ("gemm 2.0", 50), ("small 1.0", 50),
                       ("idle", 50), ("gemm 2.0", 50)):
        if cmd == "idle":
            time.sleep(2.0)
            R["events"].append([round(time.time() - T0, 3), "idle"])
            continue
        dc.set_share(ledger, share)
        t = time.time()
        r = w.ask(cmd, 60)
        R["events"].append([round(t - T0, 3), cmd, share, round(time.time() - t, 3), r])
    stop = True
    th.join()
except Exception as e:  # noqa: BLE001
    R["error"] = repr(e)
finally:
    w.stop()
    with open(os.path.join(OUT, "compute-trace.json"), "w") as f:
        json.dump(R, f)
