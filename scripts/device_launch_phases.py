#!/usr/bin/env python3
"""Where a `gpuslice run` spends its time on this host, against the launch target (bench/README.md).

    python3 scripts/device_launch_phases.py OUT.json [ROUNDS]

Runs the launch variants interleaved, ROUNDS times each (default 200), with
GPUSLICE_LAUNCH_MARKS=1: gpuslice writes `gpuslice-mark STEP NS` lines
(CLOCK_MONOTONIC, as time.monotonic_ns) from the launcher and from its
child, so each step's time is the gap to the mark before it; `spawned` is
the posix_spawn call here and `waited` the waitpid that saw gpuslice exit.
Reference programs (bare /bin/true, bwrap, small static and dynamic
programs) are timed beside them the same way. ~60 s at 200 rounds.
"""
import json
import os
import statistics
import sys
import time

CARRY = os.path.abspath(".device-carry")
G = os.path.join(CARRY, "gpuslice")


def variants():
    run = [G, "run", "--gpus", "none"]
    v = {
        "bare": ["/bin/true"],
        "gpuslice --version": [G, "--version"],
        "run env privileged": run + ["--isolation", "env", "--privileged", "--", "/bin/true"],
        "run privileged": run + ["--privileged", "--", "/bin/true"],
        "run --pid host": run + ["--pid", "host", "--", "/bin/true"],
        "run default": run + ["--", "/bin/true"],
        "run default --gpus 0": [G, "run", "--gpus", "0", "--", "/bin/true"],
    }
    static = os.path.join(CARRY, "gpuslice-static")
    if os.path.exists(static):
        v["static --version"] = [static, "--version"]
        v["static run default"] = [static] + run[1:] + ["--", "/bin/true"]
    bwrap = os.path.join(CARRY, "bwrap")
    if os.path.exists(bwrap):
        base = [bwrap, "--dev-bind", "/", "/"]
        v["bwrap"] = base + ["/bin/true"]
        v["bwrap pid"] = base + ["--unshare-pid", "/bin/true"]
        v["bwrap pid+cgroup+dev"] = base + ["--unshare-pid", "--unshare-cgroup", "--dev", "/dev", "/bin/true"]
        v["bwrap pid+cgroup+dev+proc"] = base + ["--unshare-pid", "--unshare-cgroup", "--dev", "/dev", "--proc", "/proc", "/bin/true"]
    for name in ("hello-dynamic", "hello-static"):
        p = os.path.join(CARRY, name)
        if os.path.exists(p):
            v[name] = [p]
    return v


def once(argv, env, sink):
    r, w = os.pipe()
    t0 = time.monotonic_ns()
    pid = os.posix_spawn(argv[0], argv, env, file_actions=[(os.POSIX_SPAWN_DUP2, sink, 1), (os.POSIX_SPAWN_DUP2, w, 2)])
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        data += chunk
    _, status = os.waitpid(pid, 0)
    t1 = time.monotonic_ns()
    os.close(r)
    marks = [("spawned", t0)]
    other = []
    for line in data.decode(errors="replace").splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "gpuslice-mark":
            marks.append((parts[1], int(parts[2])))
        elif line.strip():
            other.append(line)
    marks.append(("waited", t1))
    return status, marks, other


def main():
    out = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    env = dict(os.environ, GPUSLICE_LAUNCH_MARKS="1")
    sink = os.open(os.devnull, os.O_WRONLY)
    vs = variants()
    total = {k: [] for k in vs}
    steps = {k: {} for k in vs}
    errors = {}
    for i in range(rounds + 5):
        for name, argv in vs.items():
            status, marks, other = once(argv, env, sink)
            if status != 0:
                errors.setdefault(name, {"status": status, "stderr": other[-5:]})
            if i < 5:
                continue  # warm-up
            total[name].append((marks[-1][1] - marks[0][1]) / 1e6)
            marks.sort(key=lambda m: m[1])
            for (_, a), (step, b) in zip(marks, marks[1:]):
                steps[name].setdefault(step, []).append((b - a) / 1e6)
    bare = statistics.median(total["bare"])
    result = {
        "benchmark": "launch phases",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": "python3 scripts/device_launch_phases.py OUT %d" % rounds,
        "rounds": rounds,
        "errors": errors,
        "variants": {},
    }
    for name in vs:
        med = statistics.median(total[name])
        result["variants"][name] = {
            "argv": vs[name],
            "median_ms": round(med, 4),
            "p10_ms": round(statistics.quantiles(total[name], n=10)[0], 4),
            "overhead_ms": round(med - bare, 4),
            # Median gap before each mark (steps in the order they happen).
            "steps_ms": {s: round(statistics.median(v), 4) for s, v in steps[name].items()},
        }
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    for name, r in result["variants"].items():
        print(f"{name:28s} {r['median_ms']:7.3f} ms  +{r['overhead_ms']:.3f}")


if __name__ == "__main__":
    main()
