#!/usr/bin/env python3
"""Where a launch spends its time, phase by phase, on the GPU machine.

    GS_BIN=.device-carry/gpuslice-t python3 scripts/device_launch_phases.py OUTDIR

Needs a build with phase marks (`git apply scripts/launch-marks.patch`, build,
copy the binary to .device-carry/gpuslice-t; not the shipped binary); prints the median
time between consecutive marks over 200 launches per selection.
"""
import collections, json, os, statistics, subprocess, sys, time

OUT = sys.argv[1] if len(sys.argv) > 1 else "/tmp"
BIN = os.environ.get("GS_BIN", ".device-carry/gpuslice-t")
env = dict(os.environ, GS_T="1")
R = {}
for gpus in ("none", "0"):
    acc = collections.defaultdict(list)
    for _ in range(200):
        t0 = time.clock_gettime(time.CLOCK_MONOTONIC)
        p = subprocess.run([BIN, "run", "--gpus", gpus, "--", "/bin/true"], env=env, capture_output=True, text=True)
        t1 = time.clock_gettime(time.CLOCK_MONOTONIC)
        prev = t0
        for line in p.stderr.splitlines():
            if line.startswith("M "):
                _, what, t = line.split()
                acc[what].append((float(t) - prev) * 1e3)
                prev = float(t)
        acc["exit"].append((t1 - prev) * 1e3)
        acc["total"].append((t1 - t0) * 1e3)
    R[gpus] = {k: round(statistics.median(v), 4) for k, v in acc.items()}
    print(gpus, json.dumps(R[gpus], indent=0))
with open(os.path.join(OUT, "launch-phases.json"), "w") as f:
    json.dump(R, f, indent=1)
