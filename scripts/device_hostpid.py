#!/usr/bin/env python3
"""On the real GPU: the shim measures physical memory
inside the slice's PID namespace (whichever pids the driver reports: host pids, or the caller's own as driver 580 does).

    python3 scripts/device_hostpid.py OUT_DIR

Run as root from the repository root after scripts/device-build.sh
(~20 s; each case bounded at 60 s). Writes OUT_DIR/hostpid.json.

For `gpuslice run --gpus 0 --memory 20GiB` with the default PID namespace
and with `--pid host`, one worker (ctypes, no framework) creates a
context, allocates 1 GiB, asks cuMemGetInfo, asks the slice's host-pid
resolver (/run/gpuslice/slice/hostpid) itself, and waits. With
GPUSLICE_LOG=1 the shim logs each measurement. Host side, after 1.5 s:
NVML's per-process list (pynvml), `gpuslice slices --json`.

Per case `pass` when all hold:
  - `nvml_lists_slices_pid`: the pid `gpuslice slices` shows is in the
    host's NVML list (the driver knows the process by that host pid);
  - `resolver_is_host_pid`: the resolver told the worker that same pid;
  - `measured`: the shim logged "the driver holds N MiB" and never
    "NVML cannot measure" nor a resolver failure;
  - `ledger_matches_nvml`: the slice's ledger use is within 4 MiB of
    NVML's figure for the process (the context charged as measured, not
    the 512 MiB estimate).
Top-level `pass`: both cases pass.
"""

import datetime
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from device_common import CU_PRIMARY_CTX, nvml_by_pid  # noqa: E402

ROOT = os.getcwd()
GPUSLICE = os.path.join(ROOT, ".device-carry", "gpuslice")
PY = sys.executable
MIB = 1 << 20

WORKER = r'''
import ctypes, json, socket, struct, sys''' + CU_PRIMARY_CTX + r'''cu.cuCtxSetCurrent(ctx)
p = ctypes.c_uint64()
rc_alloc = cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(1 << 30))
free, total = ctypes.c_size_t(), ctypes.c_size_t()
cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
try:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2)
    s.connect("/run/gpuslice/slice/hostpid")
    answer = struct.unpack("<I", s.recv(4))[0]
except OSError as e:
    answer = repr(e)
nspid = [l for l in open("/proc/self/status") if l.startswith("NSpid:")]
print(json.dumps({"ctx": rc_ctx, "alloc": rc_alloc, "total": total.value, "resolver": answer,
                  "nspid": nspid[0].split()[1:] if nspid else None}), flush=True)
sys.stdin.readline()
'''


def case(pid_mode):
    cmd = [GPUSLICE, "run", "--gpus", "0", "--memory", "20GiB", "--pid", pid_mode, "--", PY, "-c", WORKER]
    env = dict(os.environ, GPUSLICE_LOG="1")
    t = time.monotonic()
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env)
    rec = {"command": " ".join(cmd[:-1] + ["<WORKER>"])}
    line = ""
    while p.poll() is None and time.monotonic() - t < 45:
        line = p.stdout.readline()
        if line.startswith("{"):
            break
    if line.startswith("{"):
        rec["worker"] = json.loads(line)
        time.sleep(1.5)  # the background context measurement settles
        nvml = nvml_by_pid()
        rec["nvml_pids"] = sorted(nvml)
        s = subprocess.run([GPUSLICE, "slices", "--json"], capture_output=True, text=True)
        try:
            sl = json.loads(s.stdout)["slices"]
            procs = [q for x in sl for q in x["processes"]]
            rec["slices_pid"] = procs[0]["pid"] if procs else None
            rec["ledger_used_mib"] = sl[0]["devices"][0]["used_bytes"] / MIB if sl else None
        except (ValueError, KeyError, IndexError):
            rec["slices_raw"] = s.stdout[-2000:]
        pid = rec.get("slices_pid")
        rec["nvml_used_mib"] = nvml[pid] / MIB if pid in nvml else None
        p.stdin.write("\n")
        p.stdin.flush()
    try:
        p.wait(timeout=15)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    err = p.stderr.read()
    rec["rc"] = p.returncode
    rec["stderr_tail"] = err[-2000:]
    rec["wall_s"] = time.monotonic() - t
    pid = rec.get("slices_pid")
    rec["nvml_lists_slices_pid"] = pid is not None and pid in rec.get("nvml_pids", [])
    rec["resolver_is_host_pid"] = pid is not None and rec.get("worker", {}).get("resolver") == pid
    rec["measured"] = ("the driver holds" in err and "NVML cannot measure" not in err
                       and "host pid resolver" not in err)
    used, phys = rec.get("ledger_used_mib"), rec.get("nvml_used_mib")
    rec["ledger_matches_nvml"] = used is not None and phys is not None and abs(used - phys) <= 4
    rec["pass"] = all(rec[k] for k in ("nvml_lists_slices_pid", "resolver_is_host_pid", "measured",
                                        "ledger_matches_nvml"))
    return rec


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, "hostpid.json")
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "command": " ".join([PY] + sys.argv),
        "driver": subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True).stdout.strip(),
        "cases": {},
    }
    for mode in ("private", "host"):
        try:
            result["cases"][mode] = case(mode)
        except Exception as e:  # recorded, and the case fails
            result["cases"][mode] = {"error": repr(e)[:300], "pass": False}
        with open(out, "w") as f:
            json.dump(result, f, indent=2, sort_keys=True)
    result["pass"] = all(c.get("pass") for c in result["cases"].values())
    with open(out, "w") as f:
        json.dump(result, f, indent=2, sort_keys=True)
    print(json.dumps({"pass": result["pass"], "cases": {k: v.get("pass") for k, v in result["cases"].items()}}))


if __name__ == "__main__":
    main()
