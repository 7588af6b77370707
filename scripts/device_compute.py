#!/usr/bin/env python3
"""On the GPU machine: the compute share (gpuslice run --compute).

    python3 scripts/device_compute.py OUTDIR      # as root, repo root, after device-build.sh

Workers (PyTorch, /opt/torch/.venv/bin/python3) are started once and driven
over stdin, so torch is imported once per process (~5 s):
  U  bare (no shim)                       baselines, interleaved
  N  LD_PRELOAD=libgpuslice.so, no limit  the no-limit overhead
  L  gpuslice run --compute 50            one slice; its ledger's share is
                                          rewritten between levels (50, 25, 10, 75)
  A/B gpuslice run --compute 30 / 70      two slices together
Every measurement runs 0.3 s of warm-up first (drains the bucket's burst),
then a timed window. Writes OUTDIR/compute.json after every measurement.
Whole run bounded to ~110 s; levels in priority order.
"""
import glob
import json, mmap, os, re, select, struct, subprocess, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nvml_sampler import Nvml  # noqa: E402
from device_common import CARRY, GPUSLICE, TORCH_PY as PY  # noqa: E402
from device_common import GEMM_TENSORS, budget_left, out_dir, run_record, save_timed  # noqa: E402

OUT = out_dir("/tmp/compute")
SHIM = os.path.join(CARRY, "libgpuslice.so")
T0 = time.time()
BUDGET = float(os.environ.get("COMPUTE_BUDGET_S", "108"))
GEMM_S = float(os.environ.get("GEMM_S", "2.0"))
SMALL_S = float(os.environ.get("SMALL_S", "1.5"))
COMPUTE_OFF = 332032  # ledger v2: compute section, device 0, share (basis points)

R = run_record(method="throughput of the limited slice / throughput of a bare process measured just before "
                      "(interleaved); warm-up 0.3 s before each window", levels={}, errors=[])


def save():
    save_timed(R, T0, os.path.join(OUT, "compute.json"))


WORKER = r'''
import json, os, sys, time, torch
torch.backends.cuda.matmul.allow_tf32 = True
dev = torch.device("cuda")''' + GEMM_TENSORS + r'''tiny = torch.zeros(1, device=dev)
FL = 2 * N ** 3
graph = None

def gemm(k):
    for _ in range(k):
        torch.matmul(a, b, out=c)

def small(k):
    for _ in range(k):
        x.mul_(1.0)

def replay(k):
    for _ in range(k):
        graph.replay()

def run(fn, chunk, work, secs, warm=0.3):
    t = time.perf_counter()
    while time.perf_counter() - t < warm:
        fn(chunk)
        torch.cuda.synchronize()
    n = 0
    t = time.perf_counter()
    while True:
        fn(chunk)
        n += chunk
        torch.cuda.synchronize()
        el = time.perf_counter() - t
        if el >= secs:
            break
    return {"ops": n, "s": el, "rate": n * work / el}

def latency(n):
    # enqueue cost per launch (no sync), then launch+sync round trips
    torch.cuda.synchronize()
    per = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            tiny.add_(1)
        per.append((time.perf_counter() - t) / n * 1e6)
        torch.cuda.synchronize()
    rt = []
    for _ in range(300):
        t = time.perf_counter()
        tiny.add_(1)
        torch.cuda.synchronize()
        rt.append((time.perf_counter() - t) * 1e6)
    rt.sort()
    return {"enqueue_us_best": min(per), "enqueue_us_median": sorted(per)[2], "roundtrip_us_median": rt[len(rt) // 2]}

gemm(3); small(3); torch.cuda.synchronize()
# The slice's usage ledger on the host: `run` (as root) keeps it in
# <GPUSLICE_LEDGER_DIR>/<slice>/usage (the slice sees it only at
# /run/gpuslice/slice/usage); a self-imposed one is GPUSLICE_LEDGER.
LEDGER = os.environ.get("GPUSLICE_LEDGER") or (
    os.path.join(os.environ["GPUSLICE_LEDGER_DIR"], os.environ["GPUSLICE_SLICE"], "usage")
    if os.environ.get("GPUSLICE_LEDGER_DIR") and os.environ.get("GPUSLICE_SLICE") else "")
print(json.dumps({"ready": True, "ledger": LEDGER,
                  "preload": os.environ.get("LD_PRELOAD", "")}), flush=True)
for line in sys.stdin:
    cmd = line.split()
    if not cmd:
        continue
    try:
        if cmd[0] == "gemm":
            r = run(gemm, 10, FL, float(cmd[1]))
        elif cmd[0] == "small":
            r = run(small, 100, 1, float(cmd[1]))
        elif cmd[0] == "graph":
            if graph is None:
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    gemm(2)
                torch.cuda.current_stream().wait_stream(s)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    gemm(10)
                torch.cuda.synchronize()
            r = run(replay, 2, 10 * FL, float(cmd[1]))
        elif cmd[0] == "lat":
            r = latency(int(cmd[1]))
        elif cmd[0] == "quit":
            break
        else:
            r = {"error": "unknown " + cmd[0]}
    except Exception as e:
        r = {"error": repr(e)}
    print(json.dumps(r), flush=True)
'''


NV = None


def sampled(w, cmd, timeout=30):
    """w.ask(cmd) with the SM clock and power sampled while it runs."""
    if NV is None:
        return w.ask(cmd, timeout)
    with NV:
        r = w.ask(cmd, timeout)
    r.update(NV.summary())
    return r


def left():
    return budget_left(T0, BUDGET)


class Worker:
    def __init__(self, name, argv, env):
        self.name = name
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=open(os.path.join(OUT, f"worker-{name}.err"), "w"),
                                  env=env, text=True, bufsize=1)
        self.fd = self.p.stdout.fileno()
        self.buf = b""
        self.info = None

    def read(self, timeout):
        # Our own line buffer over the raw fd: select() and a buffered
        # reader do not mix (a second line already buffered is never seen).
        end = time.time() + timeout
        while True:
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                try:
                    v = json.loads(line)
                    if isinstance(v, dict):
                        return v
                except ValueError:
                    pass
            if time.time() >= end:
                raise TimeoutError(f"worker {self.name}: no answer in {timeout:.0f}s")
            r, _, _ = select.select([self.fd], [], [], max(0.05, end - time.time()))
            if r:
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    raise RuntimeError(f"worker {self.name} exited ({self.p.poll()})")
                self.buf += chunk

    def send(self, cmd):
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()

    def ask(self, cmd, timeout=30):
        self.send(cmd)
        return self.read(timeout)

    def stop(self):
        try:
            self.send("quit")
            self.p.wait(timeout=3)
        except Exception:
            self.p.kill()


def slice_key(dev, ino):
    # gpuslice_ledger::board::slice_key: splitmix64 of the ledger's (dev, ino).
    m = (1 << 64) - 1
    z = (((dev << 32) | (dev >> 32)) & m) ^ ino ^ 0x9E3779B97F4A7C15
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return max(z ^ (z >> 31), 1)


def set_share(ledger, pct):
    # A slice of `run`: its shares are root's limits record beside the
    # ledger, which the shim re-reads every 250 ms; rewritten in place (the
    # slice's read-only bind mount follows the inode, not the name). The
    # share the other slices count for it (oversubscription) is root's
    # share record on the board directory: rewritten too, as an admin
    # changing a live slice's share must (a stale 70 % there scaled a 30 %
    # neighbour of a 60 % slice to 27 %).
    record = os.path.join(os.path.dirname(ledger), "limits")
    if os.path.exists(record):
        bp = int(round(pct * 100))
        with open(record, "r+") as f:
            text = re.sub(r"compute_bp \d+", f"compute_bp {bp}", f.read())
            f.seek(0)
            f.write(text)
            f.truncate()
        st = os.stat(ledger)
        key = "%016x" % slice_key(st.st_dev, st.st_ino)
        for share_rec in glob.glob(f"/run/gpuslice/gpus/shares/*/{key}"):
            with open(share_rec, "w") as f:
                f.write(f"{bp}\n")
        time.sleep(0.3)
        return
    with open(ledger, "r+b") as f:
        m = mmap.mmap(f.fileno(), 0)
        assert struct.unpack_from("<I", m, 8)[0] == 2, "ledger version 2 expected"
        struct.pack_into("<Q", m, COMPUTE_OFF, int(round(pct * 100)))
        m.close()


def read_compute(ledger):
    with open(ledger, "rb") as f:
        b = f.read()
    share, burst, tokens, last, busy, thr, launches, delayed = struct.unpack_from("<QQqQQQQQ", b, COMPUTE_OFF)
    return {"share_bp": share, "busy_s": busy / 1e9, "throttled_s": thr / 1e9,
            "launches": launches, "delayed": delayed}


def main():
    global NV
    try:
        NV = Nvml()
        R["driver"] = NV.driver
    except Exception as e:  # noqa: BLE001
        R["errors"].append(f"NVML sampler: {e!r}")
    base_env = dict(os.environ)
    for k in ("LD_PRELOAD", "GPUSLICE_COMPUTE_LIMIT", "GPUSLICE_MEMORY_LIMIT", "GPUSLICE_LEDGER"):
        base_env.pop(k, None)
    ldir = os.path.join(OUT, "ledgers")
    os.makedirs(ldir, exist_ok=True)
    base_env["GPUSLICE_LEDGER_DIR"] = ldir
    base_env["GPUSLICE_BOARD_DIR"] = os.path.join(OUT, "boards")
    py = [PY, "-c", WORKER]

    def sliced(pct, mode="cap"):
        return [GPUSLICE, "run", "--gpus", "0", "--isolation", "env", "--compute", str(pct),
                "--compute-mode", mode, "--"] + py

    env_n = dict(base_env, LD_PRELOAD=SHIM)

    def on(cpu, argv):
        # U, N and L are only ever asked one at a time: one core for the
        # three keeps a core's speed out of their comparison (unpinned,
        # which core a process got moved launch latency by 25 %).
        return ["taskset", "-c", str(cpu)] + argv

    ws = {"U": Worker("U", on(2, py), base_env), "N": Worker("N", on(2, py), env_n),
          "L": Worker("L", on(2, sliced(50)), base_env),
          "A": Worker("A", on(4, sliced(30)), base_env), "B": Worker("B", on(6, sliced(70)), base_env),
          "G": Worker("G", on(8, sliced(30, "guaranteed")), base_env)}
    try:
        for n, w in ws.items():
            w.info = w.read(max(5, min(60, left())))
            R.setdefault("workers", {})[n] = w.info
        R["startup_s"] = round(time.time() - T0, 1)
        save()
        U, L = ws["U"], ws["L"]
        ledger = L.info["ledger"]

        def level(pct, kinds=("gemm", "small")):
            set_share(ledger, pct)
            res = R["levels"].setdefault(str(pct), {})
            for k in kinds:
                secs = GEMM_S if k == "gemm" else SMALL_S
                if left() < 2 * secs + 3:
                    R["errors"].append(f"skipped {pct}% {k}: time")
                    return
                before = read_compute(ledger)
                u = sampled(U, f"{k} {secs}")
                l = sampled(L, f"{k} {secs}")
                after = read_compute(ledger)
                ratio = l["rate"] / u["rate"]
                res[k] = {"unlimited": u, "limited": l, "ratio": ratio,
                          "error_points": abs(100 * ratio - pct),
                          "ledger_busy_s": after["busy_s"] - before["busy_s"],
                          "ledger_throttled_s": after["throttled_s"] - before["throttled_s"]}
                # The targets are 10, 25, 50 and 75 %; 100 % shows
                # what metering costs a slice that is never throttled.
                errs = [v["error_points"] for p, lv in R["levels"].items() if p != "100"
                        for v in lv.values() if "error_points" in v]
                if errs:
                    R["mae_points"] = sum(errs) / len(errs)
                    R["max_error_points"] = max(errs)
                    R["mae_levels"] = sorted(int(p) for p in R["levels"] if p != "100")
                save()

        # At 100 % nothing waits: what metering itself costs.
        level(100)
        level(50)
        level(25)
        # Two slices together: 30 / 70 (the whole GPU), then 30 / 60.
        # Each slice's ledger says how much GPU time its events measured.
        A, B = ws["A"], ws["B"]
        for key, b_pct in (("pair_30_70", 70), ("pair_30_60", 60)):
            if left() < 8:
                break
            set_share(B.info["ledger"], b_pct)
            solo = U.ask(f"gemm {GEMM_S}")
            la0, lb0 = read_compute(A.info["ledger"]), read_compute(B.info["ledger"])
            A.send(f"gemm {GEMM_S + 1}")
            B.send(f"gemm {GEMM_S + 1}")
            ra, rb = A.read(30), B.read(30)
            la1, lb1 = read_compute(A.info["ledger"]), read_compute(B.info["ledger"])
            target = 30 / b_pct
            R[key] = {"a": ra, "b": rb, "unlimited": solo, "ratio_a_over_b": ra["rate"] / rb["rate"],
                      "target": target, "rel_error": (ra["rate"] / rb["rate"]) / target - 1,
                      "a_share": ra["rate"] / solo["rate"], "b_share": rb["rate"] / solo["rate"],
                      "a_ledger_busy_s": la1["busy_s"] - la0["busy_s"],
                      "b_ledger_busy_s": lb1["busy_s"] - lb0["busy_s"],
                      "window_s": ra["s"] + 0.3}
            save()
        set_share(B.info["ledger"], 70)
        # CUDA graph under 50 %.
        if left() > 8:
            set_share(ledger, 50)
            u = U.ask(f"graph {GEMM_S}")
            l = L.ask(f"graph {GEMM_S}")
            R["graph_50"] = {"unlimited": u, "limited": l, "ratio": l["rate"] / u["rate"],
                             "error_points": abs(100 * l["rate"] / u["rate"] - 50)}
            save()
        # Work-conserving: a guaranteed 30 % alone, then beside a busy
        # capped 30 % (expected: ~95 % alone; ~65 % and 30 % together).
        if left() > 8:
            G, A = ws["G"], ws["A"]
            solo = U.ask(f"gemm {GEMM_S}")
            alone = G.ask(f"gemm {GEMM_S}")
            G.send(f"gemm {GEMM_S + 1}")
            A.send(f"gemm {GEMM_S + 1}")
            rg, ra = G.read(30), A.read(30)
            R["guaranteed_30"] = {"unlimited": solo, "alone": alone, "alone_share": alone["rate"] / solo["rate"],
                                  "beside_cap_30": {"g": rg, "a": ra, "g_share": rg["rate"] / solo["rate"],
                                                    "a_share": ra["rate"] / solo["rate"]},
                                  "expected": {"alone": 0.95, "g_beside": 0.65, "a_beside": 0.30}}
            save()
        level(10)
        level(75)
        # No-limit overhead: shim loaded (no limit) vs bare, alternating.
        N = ws["N"]
        rounds = []
        for i in range(3):
            if left() < 6:
                R["errors"].append("overhead: stopped early (time)")
                break
            pair = {}
            for name, w in ((("U", U), ("N", N)) if i % 2 == 0 else (("N", N), ("U", U))):
                pair[name] = {"gemm": w.ask("gemm 1.0"), "lat": w.ask("lat 2000")}
            rounds.append(pair)
            g = [r["N"]["gemm"]["rate"] / r["U"]["gemm"]["rate"] for r in rounds]
            e = [r["N"]["lat"]["enqueue_us_median"] / r["U"]["lat"]["enqueue_us_median"] for r in rounds]
            t = [r["N"]["lat"]["roundtrip_us_median"] / r["U"]["lat"]["roundtrip_us_median"] for r in rounds]
            R["no_limit_overhead"] = {"rounds": rounds, "gemm_ratio_mean": sum(g) / len(g),
                                      "enqueue_latency_ratio_mean": sum(e) / len(e),
                                      "roundtrip_latency_ratio_mean": sum(t) / len(t)}
            save()
        R["slice_ledger_L"] = read_compute(ledger)
    except Exception as e:
        R["errors"].append(repr(e))
    finally:
        save()
        for w in ws.values():
            w.stop()
        save()


if __name__ == "__main__":
    main()
