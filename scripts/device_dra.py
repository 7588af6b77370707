#!/usr/bin/env python3
"""On the GPU machine: the DRA driver on the real GPU, its claims run
by `gpuslice run --cdi-device` (no container runtime there).

    python3 scripts/device_dra.py OUTDIR   # as root, repo root, after device-build.sh

Writes OUTDIR/dra.json after every step (command, date, driver, pass):
  prepare    `gpuslice bench dra-selftest prepare`: the driver publishes GPU 0 to the API
             TEST DOUBLE (gpu-0, one device per GPU, with allowMultipleAllocations and
             memory defaulting to all of it, compute to 1 %), the test kubelet registers it
             as the kubelet's grpc-go does (the socket path percent-encoded as :authority) and
             prepares two claims written the way kube-scheduler writes them (consumedCapacity,
             shareID): 20Gi/30 and 40Gi/60; the health the plugin reports with the XID watcher
             on the real NVML: every device Healthy
  alloc      both slices at once, each started from its CDI device ID with
             `gpuslice run --cdi-device` running PyTorch: mem_get_info total == its cap
             (20 / 40 GiB), 1 GiB tensors held until refused: want held_gib in
             [cap - 1, cap] and the next one refused (both hold together)
  gemm       then 8192^2 bf16 GEMMs in both, counted over the SAME wall-clock window
             (a common start time, warmed up before it): want ratio 1:2 within 2 %
  bench      `gpuslice bench dra --claims 1000` (health: synthetic on a real GPU):
             NodePrepareResources p50/p90/p99/max (want p99 <= 20 ms), ResourceSlice
             re-published after a health change (want <= 1 s); its JSON as bench-dra.json
  bare       the same GEMM client with no gpuslice, alone, right after: each claim's
             fraction of the whole GPU (want within 3 points of 30 % and 60 %)
  unprepare  `gpuslice bench dra-selftest unprepare` (a restarted plugin, from its
             checkpoint): every spec and limits record removed
pass: every step's want holds. Bounded to ~150 s (DRA_BUDGET_S); never changes GPU settings.
"""
import json, os, shutil, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from device_common import GPUSLICE, TORCH_PY as PY  # noqa: E402
from device_common import budget_left, results, out_dir, record_driver, run_record, save_timed  # noqa: E402

OUT = out_dir("/tmp/dra")
T0 = time.time()
BUDGET = float(os.environ.get("DRA_BUDGET_S", "150"))
GIB = 1 << 30
R = run_record(steps={}, errors=[], **{"pass": False})

# One process per slice: allocation to the cap, held until both have
# reported, then GEMMs over a window both know.
WORKER = r'''
import json, sys, time, torch
cap_gib, release_at, start_at, secs = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
dev = torch.device("cuda")
out = {"cap_gib": cap_gib}
free, total = torch.cuda.mem_get_info()
out["mem_get_info_total"] = total
held, refused = [], False
try:
    for _ in range(int(cap_gib) + 4):
        held.append(torch.empty(1 << 30, dtype=torch.uint8, device=dev))
except torch.cuda.OutOfMemoryError:
    refused = True
out["held_gib"] = len(held)
out["refused_beyond"] = refused
print("RESULT " + json.dumps(dict(out, phase="alloc")), flush=True)
while time.time() < release_at:
    time.sleep(0.05)
del held
torch.cuda.empty_cache()
n = 8192
a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
while time.time() < start_at:          # warm-up until the common start
    torch.matmul(a, b); torch.cuda.synchronize()
t0, count = time.time(), 0
end = start_at + secs
while True:
    for _ in range(4):
        torch.matmul(a, b)
    torch.cuda.synchronize()
    count += 4
    if time.time() >= end:
        break
t1 = time.time()
out.update(phase="gemm", gemms=count, window=[t0, t1], late_start_s=t0 - start_at, gemm_per_s=count / (t1 - t0))
print("RESULT " + json.dumps(out), flush=True)
'''


def left():
    return budget_left(T0, BUDGET)


def save():
    save_timed(R, T0, os.path.join(OUT, "dra.json"))


def selftest(work, phase, timeout):
    out = os.path.join(OUT, f"dra-{phase}.json")
    cmd = [GPUSLICE, "bench", "dra-selftest", phase, "--work", work, "--out", out]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    try:
        with open(out) as f:
            rep = json.load(f)
    except (OSError, ValueError):
        rep = {"pass": False}
    rep["rc"], rep["stderr_tail"], rep["argv"] = p.returncode, p.stderr[-1500:], cmd
    return rep


def bare_window(gemm):
    """The same GEMM client run with no gpuslice, alone on the GPU, right
    after the claims: each claim's throughput as a fraction of it, so a
    share is read against the whole GPU and not only against its neighbour
    (claims at 30/60/100 got 9-11 % each on the fake host)."""
    now = time.time()
    cmd = [PY, "-c", WORKER, "4", str(now), str(now + 8), "12"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    bare = next((r for r in results(p.stdout) if r["phase"] == "gemm"), None)
    shares = [30, 60]
    step = {"argv": cmd, "rc": p.returncode, "stderr_tail": p.stderr[-800:], "bare": bare,
            "want": "each claim's gemm_per_s / bare within 3 points of its share (30 %, 60 %)"}
    if bare:
        step["fraction_of_bare"] = [round(g.get("gemm_per_s", 0) / bare["gemm_per_s"], 4) for g in gemm]
        step["pass"] = all(abs(f * 100 - s) <= 3 for f, s in zip(step["fraction_of_bare"], shares))
    return step


def main():
    record_driver(R)
    work = tempfile.mkdtemp(prefix="gpuslice-dra-")
    os.chmod(work, 0o755)
    oks = {}
    try:
        prep = selftest(work, "prepare", 30)
        R["steps"]["prepare"] = prep
        shared = prep.get("published", {}).get("shared_device") or {}
        oks["prepare"] = bool(prep.get("pass")) and len(prep.get("claims", [])) == 2 \
            and shared.get("allowMultipleAllocations") is True
        save()
        if not oks["prepare"]:
            raise RuntimeError("prepare failed")
        claims = prep["claims"]
        caps = [20, 40]
        now = time.time()
        release_at, start_at, secs = now + 30, now + 38, 12
        procs = []
        for c, cap in zip(claims, caps):
            cmd = [GPUSLICE, "run", "--cdi-spec-dir", os.path.join(work, "cdi"),
                   "--cdi-device", c["cdi_device_ids"][0], "--",
                   PY, "-c", WORKER, str(cap), str(release_at), str(start_at), str(secs)]
            procs.append((subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), cmd))
        got = []
        for p, cmd in procs:
            try:
                o, e = p.communicate(timeout=max(10, start_at + secs + 30 - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                o, e = p.communicate()
            got.append({"argv": cmd, "rc": p.returncode, "results": results(o), "stderr_tail": e[-1500:]})
        alloc = [next((r for r in g["results"] if r["phase"] == "alloc"), None) for g in got]
        gemm = [next((r for r in g["results"] if r["phase"] == "gemm"), None) for g in got]
        R["steps"]["alloc"] = {
            "slices": [dict(a or {}, rc=g["rc"], argv=g["argv"], stderr_tail=g["stderr_tail"]) for a, g in zip(alloc, got)],
            "want": "mem_get_info_total == cap (20 / 40 GiB); held_gib in [cap - 1, cap] and refused_beyond"}
        oks["alloc"] = all(a is not None and a["mem_get_info_total"] == cap * GIB
                           and cap - 1 <= a["held_gib"] <= cap and a["refused_beyond"]
                           for a, cap in zip(alloc, caps))
        ratio = gemm[0]["gemm_per_s"] / gemm[1]["gemm_per_s"] if all(gemm) else None
        R["steps"]["gemm"] = {
            "common_start": start_at, "window_s": secs, "slices": gemm, "ratio": ratio,
            "off_1_2_percent": None if ratio is None else round(100 * abs(ratio / 0.5 - 1), 2),
            "want": "off_1_2_percent <= 2 (compute 30 % vs 60 %, the same wall-clock window)"}
        oks["gemm"] = ratio is not None and abs(ratio / 0.5 - 1) <= 0.02
        save()
        if left() > 70:
            R["steps"]["bare"] = bare_window([g or {} for g in gemm])
            save()
        if left() > 45:
            bench_out = os.path.join(OUT, "bench-dra.json")
            cmd = [GPUSLICE, "bench", "dra", "--claims", "1000", "--out", bench_out]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=min(60, left() - 15))
            try:
                with open(bench_out) as f:
                    b = json.load(f)
            except (OSError, ValueError):
                b = {}
            R["steps"]["bench"] = {"argv": cmd, "rc": p.returncode, "stderr_tail": p.stderr[-1500:],
                                   "prepare": (b.get("prepare") or {}).get("latency"),
                                   "health": b.get("health"), "pass": b.get("pass"),
                                   "want": "prepare p99 <= 20 ms; re-published <= 1000 ms after a health change"}
            oks["bench"] = b.get("pass") is True
        else:
            R["errors"].append(f"bench: skipped, {left():.0f} s left of the budget")
            oks["bench"] = False
        save()
    except Exception as e:  # noqa: BLE001
        R["errors"].append(repr(e))
    finally:
        try:
            un = selftest(work, "unprepare", 30)
            R["steps"]["unprepare"] = un
            oks["unprepare"] = bool(un.get("pass"))
        except Exception as e:  # noqa: BLE001
            R["errors"].append(f"unprepare: {e!r}")
            oks["unprepare"] = False
        shutil.rmtree(work, ignore_errors=True)
    R["checks"] = oks
    R["pass"] = all(oks.get(k) for k in ("prepare", "alloc", "gemm", "bench", "unprepare"))
    save()


if __name__ == "__main__":
    main()
