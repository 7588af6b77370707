#!/usr/bin/env python3
"""On the real GPU (driver 580, no memory partitions): the lookups
the shim closed, root's enforcer, and what `slices` and `doctor` say.

    python3 scripts/device_enforcer.py OUT_DIR        # default: $OUT

Run as root from the repository root after scripts/device-build.sh (the
binaries and the C client in .device-carry/). Writes OUT_DIR/enforcer.json
(rewritten after every part: a run cut short keeps what it measured) with
the exact command, date and driver. About 2 minutes.

  closed    the C client (crates/gpuslice/tests/escapes/driver_client.c)
            under `--memory 1GiB`, each asking 40 x 256 MiB: `dlvsym`
            (glibc's dlsym through dlvsym(RTLD_DEFAULT, "dlsym",
            "GLIBC_2.34")), `libc` (dlsym(<libc>, "dlsym")) and `dlmopen`
            (libcuda in a new namespace). `pass`: each got at most 1 GiB
            (the first two refused at the cap, dlmopen refused outright).
  kill      the `elf` client (joins through the shim, then finds
            cuMemAlloc_v2 in libcuda's ELF symbol table and calls it: a way
            the shim cannot see) asking 5 x 256 MiB, which with its context
            (~520 MiB) passes the cap: `kill_s`, from the client's line
            saying it holds the memory to the shell's line saying it died,
            and the launcher's log line. Then the same asking 40 x 256 MiB
            (the issue's 10 GiB). After each kill the slice lives on (a
            plain holder), so `gpuslice slices --json` shows the recorded
            kill. `pass`: killed (137) within 2 s.
  slices    the `elf` client asking 1 x 256 MiB (under the cap with its
            context): `gpuslice slices --json` and the text report, next to
            nvidia-smi's figure for the process. `pass`: the slice's
            `driver_used_bytes` is NVML's figure (within 2 MiB of
            nvidia-smi's), the process is not called enforced.
  cpu       the launcher's CPU time (utime + stime of its /proc stat) over
            30 s while a capped slice holds 256 MiB (the enforcer ticking 4
            times a second), against 15 s of a launch without limits (no
            enforcer): `cpu_percent` of one core, and per tick.
  doctor    `gpuslice doctor --json`: every check whose name or message
            speaks of memory partitions or limits, and whether this
            driver's nvidia-smi has `memory-limits` (R615+).
"""

import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from device_common import Results  # noqa: E402

ROOT = os.getcwd()
CARRY = os.path.join(ROOT, ".device-carry")
GPUSLICE = os.path.join(CARRY, "gpuslice")
CLIENT_SRC = os.path.join(ROOT, "crates/gpuslice/tests/escapes/driver_client.c")
MIB = 1 << 20
CHUNK = 256 * MIB
CAP = "1GiB"
CAP_BYTES = 1 << 30
RESULT = Results()


def client_path():
    """The C client: .device-carry/driver_client (device-build.sh), else
    compiled here when a C compiler exists."""
    built = os.path.join(CARRY, "driver_client")
    if os.access(built, os.X_OK):
        return built
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no .device-carry/driver_client and no C compiler")
    out = os.path.join(OUT_DIR, "driver_client")
    subprocess.run([cc, "-O1", "-o", out, CLIENT_SRC], check=True)
    return out


def run_capped(args, timeout=60):
    cmd = [GPUSLICE, "run", "--gpus", "0", "--memory", CAP, "--"] + args
    t = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    line = next((l for l in p.stdout.splitlines() if l.startswith("{")), None)
    return {
        "command": " ".join(cmd),
        "rc": p.returncode,
        "client": json.loads(line) if line else None,
        "stderr_tail": p.stderr[-800:],
        "wall_s": round(time.monotonic() - t, 3),
    }


def part_closed(c):
    out = {}
    for how in ("dlvsym", "libc", "dlmopen"):
        r = run_capped([c, how, "40"])
        got = (r["client"] or {}).get("allocated", 0) * CHUNK
        r["allocated_mib"] = got // MIB
        r["pass"] = got <= CAP_BYTES and (how != "dlmopen" or r["rc"] == 3)
        out[how] = r
    out["pass"] = all(v["pass"] for v in out.values() if isinstance(v, dict))
    return out


def slices_json():
    p = subprocess.run([GPUSLICE, "slices", "--json"], capture_output=True, text=True, timeout=30)
    try:
        return json.loads(p.stdout)
    except ValueError:
        return {"error": p.stderr[-500:]}


def gpu_evidence(pid):
    """What makes `pid` a GPU process to `slices`: the mappings naming
    nvidia or cuda, the descriptors on /dev/nvidia*, and its NSpid line."""
    out = {}
    try:
        out["maps"] = sorted({l.split()[-1] for l in open(f"/proc/{pid}/maps")
                              if "nvidia" in l or "cuda" in l})
        fds = []
        for n in os.listdir(f"/proc/{pid}/fd"):
            try:
                fds.append(os.readlink(f"/proc/{pid}/fd/{n}"))
            except OSError:  # closed meanwhile (the listing's own)
                pass
        out["fds"] = sorted(f for f in fds if f.startswith("/dev/"))
        out["nspid"] = [l.strip() for l in open(f"/proc/{pid}/status") if l.startswith("NSpid")]
    except OSError as e:
        out["error"] = repr(e)
    return out


def nvidia_smi_apps():
    p = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                       capture_output=True, text=True)
    apps = {}
    for l in p.stdout.splitlines():
        try:
            pid, mib = [x.strip() for x in l.split(",")]
            apps[int(pid)] = int(mib)
        except ValueError:
            pass
    return apps


def read_until(p, want, deadline):
    """Lines of p.stdout until one starting with `want`: (line, monotonic time)."""
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            return None, time.monotonic()
        if line.startswith(want):
            return line.strip(), time.monotonic()
    return None, time.monotonic()


def stop(p):
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def part_kill(c, count):
    script = f'{c} elf {count} hold; echo "rc $?"; exec {c} plain 1 hold'
    cmd = [GPUSLICE, "run", "--gpus", "0", "--memory", CAP, "--", "sh", "-c", script]
    rec = {"command": " ".join(cmd), "asked_mib": count * CHUNK // MIB}
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    try:
        first, t_alloc = read_until(p, "{", deadline)
        rec["client"] = json.loads(first) if first else None
        rc_line, t_rc = read_until(p, "rc ", deadline)
        rec["client_rc_line"] = rc_line
        if first and rc_line:
            rec["kill_s"] = round(t_rc - t_alloc, 3)
        held, _ = read_until(p, "held", deadline)
        if held:
            v = slices_json()
            s = (v.get("slices") or [{}])[0]
            rec["slices_kills"] = s.get("enforcement_kills")
            rec["slices_devices"] = s.get("devices")
    finally:
        stop(p)
    err = p.stderr.read()
    rec["launcher_log"] = [l for l in err.splitlines() if "enforcer" in l][:5]
    rec["pass"] = rc_line == "rc 137" and rec.get("kill_s", 99) < 2.0
    return rec


def part_slices(c):
    cmd = [GPUSLICE, "run", "--gpus", "0", "--memory", CAP, "--", c, "elf", "1", "hold"]
    rec = {"command": " ".join(cmd)}
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        held, _ = read_until(p, "held", time.monotonic() + 30)
        time.sleep(1.0)
        v = slices_json()
        rec["slices_json"] = v
        rec["slices_text"] = subprocess.run([GPUSLICE, "slices"], capture_output=True, text=True).stdout[-3000:]
        # Why `slices` calls a process of the slice a GPU process (the
        # slice's own init was flagged on the H200 before `slices` left it
        # out): its NVIDIA and CUDA mappings and descriptors, and its pid
        # in each pid namespace.
        rec["unenforced_why"] = {
            str(q.get("pid")): gpu_evidence(q.get("pid"))
            for s in v.get("slices") or [] for q in s.get("unenforced") or []
        }
        apps = nvidia_smi_apps()
        rec["nvidia_smi_mib"] = apps
        s = (v.get("slices") or [{}])[0]
        procs = s.get("processes") or []
        dev = (s.get("devices") or [{}])[0]
        smi = sum(mib for pid, mib in apps.items() if any(q.get("pid") == pid for q in procs))
        rec["driver_used_mib"] = (dev.get("driver_used_bytes") or 0) / MIB
        rec["ledger_used_mib"] = (dev.get("used_bytes") or 0) / MIB
        rec["nvidia_smi_slice_mib"] = smi
        rec["pass"] = (held is not None and dev.get("driver_used_bytes") is not None
                       and abs(rec["driver_used_mib"] - smi) <= 2
                       and all(q.get("enforced") is not True for q in procs)
                       # The shim is in the command; the slice's init is ours.
                       and not s.get("unenforced"))
    finally:
        stop(p)
    rec["launcher_log"] = [l for l in p.stderr.read().splitlines() if "enforcer" in l][:5]
    return rec


def cpu_ticks(pid):
    stat = open(f"/proc/{pid}/stat").read()
    f = stat.rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])  # utime + stime (fields 14, 15)


def measure_cpu(c, capped, seconds):
    limits = ["--memory", CAP] if capped else []
    cmd = [GPUSLICE, "run", "--gpus", "0"] + limits + ["--", c, "plain", "1", "hold"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rec = {"command": " ".join(cmd), "seconds": seconds}
    try:
        read_until(p, "held", time.monotonic() + 30)
        hz = os.sysconf("SC_CLK_TCK")
        a, t0 = cpu_ticks(p.pid), time.monotonic()
        time.sleep(seconds)
        b, t1 = cpu_ticks(p.pid), time.monotonic()
        rec["launcher_cpu_s"] = (b - a) / hz
        rec["cpu_percent"] = round(100.0 * (b - a) / hz / (t1 - t0), 4)
        if capped:
            rec["ticks"] = int((t1 - t0) / 0.25)
            rec["cpu_ms_per_tick"] = round(1000.0 * (b - a) / hz / max(rec["ticks"], 1), 4)
    finally:
        stop(p)
    return rec


def part_doctor():
    p = subprocess.run([GPUSLICE, "doctor", "--json"], capture_output=True, text=True, timeout=120)
    rec = {"rc": p.returncode}
    try:
        v = json.loads(p.stdout)
    except ValueError:
        rec["error"] = p.stderr[-500:]
        return rec
    checks = v.get("checks", v if isinstance(v, list) else [])
    pat = re.compile(r"partition|memory.limit|memory-limit|dmem", re.I)
    rec["partition_checks"] = [c for c in checks if pat.search(json.dumps(c))]
    h = subprocess.run(["nvidia-smi", "memory-limits", "--help"], capture_output=True, text=True)
    rec["nvidia_smi_memory_limits_rc"] = h.returncode
    rec["nvidia_smi_memory_limits_out"] = (h.stdout + h.stderr)[:400]
    return rec


def main():
    global OUT_DIR
    OUT_DIR = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", ".")
    os.makedirs(OUT_DIR, exist_ok=True)
    RESULT.path = os.path.join(OUT_DIR, "enforcer.json")
    RESULT.update({
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "command": " ".join([sys.executable] + sys.argv),
        "driver": subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                  "--format=csv,noheader"], capture_output=True, text=True).stdout.strip(),
        "kernel": os.uname().release,
        "cap": CAP,
    })
    RESULT.save()
    c = client_path()
    parts = [
        ("closed", lambda: part_closed(c)),
        ("kill", lambda: part_kill(c, 5)),
        ("kill_10gib", lambda: part_kill(c, 40)),
        ("slices", lambda: part_slices(c)),
        ("cpu", lambda: {"with_enforcer": measure_cpu(c, True, 30),
                         "without_limits": measure_cpu(c, False, 15)}),
        ("doctor", part_doctor),
    ]
    for name, run in parts:
        try:
            RESULT[name] = run()
        except Exception as e:  # keep what the other parts measured
            RESULT[name] = {"error": repr(e)[:500], "pass": False}
        RESULT.save()
    failed = [n for n, _ in parts if isinstance(RESULT.get(n), dict) and RESULT[n].get("pass") is False]
    RESULT["failed"] = failed
    RESULT["pass"] = not failed
    RESULT.save()
    print(json.dumps({k: RESULT.get(k) for k in ("date", "driver", "pass", "failed")}))


if __name__ == "__main__":
    main()
