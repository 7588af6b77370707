#!/usr/bin/env python3
"""On the GPU machine: compute shares at inference-sharing scale.

    python3 scripts/device_compute29.py OUTDIR    # as root, repo root, after device-build.sh

The torch GEMM worker of device_compute.py (4096^2 bf16), started once per
slice and driven over stdin. Cases, each over one common window, each
slice's GEMM throughput against a bare worker's measured in the same run
(before and after the cases):
  10/90, 30/70, 8 x 12.5, 16 x 6.25, and a slice of 4 processes at 50 %
  beside a slice of 1 process at 50 % (the 4 run under one `gpuslice run`,
  started by a relay that sends every command to all of them).
Per case: each slice's throughput share against its target (points), the
error (max, mean), the GPU's total (sum of the slices' shares of bare),
pair ratios against their targets, and from the GPU's board the
hand-overs a second and the fallbacks to time-slicing. Writes
OUTDIR/compute29.json after every case.
"""
import glob, json, os, struct, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from device_compute import WORKER, Worker, GPUSLICE, PY  # noqa: E402
from device_common import run_record, save_timed  # noqa: E402

OUT = sys.argv[1] if len(sys.argv) > 1 else "/tmp/compute29"
os.makedirs(OUT, exist_ok=True)
T0 = time.time()
BUDGET = float(os.environ.get("COMPUTE29_BUDGET_S", "220"))
SECS = float(os.environ.get("COMPUTE29_S", "4.0"))
R = run_record(method="GEMM throughput of each slice over one common window / a bare worker's "
                      "(mean of before and after the cases)", cases={}, errors=[])

# Sends each command line to N workers (children, so one slice) and
# answers with their summed rate.
RELAY = r'''
import json, subprocess, sys
n, py, worker = int(sys.argv[1]), sys.argv[2], sys.argv[3]
kids = [subprocess.Popen([py, "-c", worker], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, bufsize=1) for _ in range(n)]
def line(k):
    while True:
        l = k.stdout.readline()
        if not l:
            raise SystemExit("worker exited")
        try:
            return json.loads(l)
        except ValueError:
            pass
infos = [line(k) for k in kids]
print(json.dumps(dict(infos[0], processes=n)), flush=True)
for cmd in sys.stdin:
    for k in kids:
        k.stdin.write(cmd)
        k.stdin.flush()
    if cmd.split()[:1] == ["quit"]:
        break
    rs = [line(k) for k in kids]
    print(json.dumps({"rate": sum(r.get("rate", 0) for r in rs), "each": rs}), flush=True)
'''


def save():
    save_timed(R, T0, os.path.join(OUT, "compute29.json"))


def board_counts(boards):
    # Header of the GPU's board (layout version 2): the turn's sequence
    # number (u32 at 40, one per hand-over) and the fallbacks (u64 at 48).
    seq = fb = 0
    for p in glob.glob(os.path.join(boards, "*.board")):
        with open(p, "rb") as f:
            h = f.read(64)
        seq += struct.unpack_from("<I", h, 40)[0]
        fb += struct.unpack_from("<Q", h, 48)[0]
    return seq, fb


def main():
    env = dict(os.environ)
    for k in ("LD_PRELOAD", "GPUSLICE_COMPUTE_LIMIT", "GPUSLICE_MEMORY_LIMIT", "GPUSLICE_LEDGER"):
        env.pop(k, None)
    env["GPUSLICE_LEDGER_DIR"] = os.path.join(OUT, "ledgers")
    os.makedirs(env["GPUSLICE_LEDGER_DIR"], exist_ok=True)
    worker = [PY, "-c", WORKER]

    def sliced(pct, procs=1):
        argv = worker if procs == 1 else [PY, "-c", RELAY, str(procs), PY, WORKER]
        return [GPUSLICE, "run", "--gpus", "0", "--isolation", "env", "--compute", str(pct), "--"] + argv

    cases = [
        ("10/90", [(10, 1), (90, 1)]),
        ("30/70", [(30, 1), (70, 1)]),
        ("8x12.5", [(12.5, 1)] * 8),
        ("16x6.25", [(6.25, 1)] * 16),
        ("4 processes at 50 / 1 process at 50", [(50, 4), (50, 1)]),
    ]
    bare = Worker("bare", worker, env)
    bare.info = bare.read(60)
    rates = [bare.ask(f"gemm {SECS}", 60)["rate"]]
    R["bare_before"] = rates[0]
    save()
    for name, slices in cases:
        if time.time() - T0 > BUDGET - 30:
            R["errors"].append(f"{name}: out of time")
            break
        # Each case on a board directory of its own, so its counts are its own.
        # (A case's name, "10/90", is no file name: its workers' logs and
        # boards take it with "_".)
        fname = name.replace("/", "_").replace(" ", "_")
        boards = os.path.join(OUT, "boards-" + fname)
        cenv = dict(env, GPUSLICE_BOARD_DIR=boards)
        ws = [Worker(f"{fname}-{i}", sliced(p, n), cenv) for i, (p, n) in enumerate(slices)]
        try:
            for w in ws:
                w.info = w.read(120)
            for w in ws:  # a warm-up window together (drains the bursts)
                w.send("gemm 1.0")
            for w in ws:
                w.read(60)
            seq0, fb0 = board_counts(boards)
            t = time.time()
            for w in ws:
                w.send(f"gemm {SECS}")
            got = [w.read(60 + SECS) for w in ws]
            wall = time.time() - t
            seq1, fb1 = board_counts(boards)
            R["cases"][name] = {"targets": [p for p, _ in slices], "processes": [n for _, n in slices],
                                "rates": [g.get("rate") for g in got], "handovers": seq1 - seq0,
                                "handovers_per_s": (seq1 - seq0) / wall, "fallbacks": fb1 - fb0}
        except Exception as e:  # noqa: BLE001
            R["errors"].append(f"{name}: {e!r}")
        finally:
            for w in ws:
                w.stop()
        save()
    rates.append(bare.ask(f"gemm {SECS}", 60)["rate"])
    bare.stop()
    ref = sum(rates) / len(rates)
    R["bare_after"], R["bare"] = rates[-1], ref
    for c in R["cases"].values():
        got = [100.0 * r / ref for r in c["rates"]]
        err = [abs(g - t) for g, t in zip(got, c["targets"])]
        c.update(percent_of_bare=got, error_max_points=max(err), error_mean_points=sum(err) / len(err),
                 gpu_total_percent=sum(got))
        if len(got) == 2:
            c["ratio_off_percent"] = 100.0 * abs((got[0] / got[1]) / (c["targets"][0] / c["targets"][1]) - 1)
    R["pass"] = all(c["error_max_points"] <= 1.0 and c["gpu_total_percent"] >= 97.0 and c["fallbacks"] == 0
                    for c in R["cases"].values()) and not R["errors"]
    save()
    print(json.dumps({k: (v.get("percent_of_bare"), v.get("gpu_total_percent"), v.get("fallbacks"))
                      for k, v in R["cases"].items()}))


if __name__ == "__main__":
    main()
