#!/usr/bin/env python3
"""What NVML's per-process accounting tells a process inside `gpuslice run`'s
PID namespace, against `--pid host` (~30 s).

    python3 scripts/device_nvml_pidns.py OUTDIR   # as root, repo root, after device-build.sh

A torch process holds a context and 1 GiB, then asks NVML
(nvmlDeviceGetComputeRunningProcesses_v3) for the processes on GPU 0 and
prints the list: the pids and `usedGpuMemory` it sees (NVML_VALUE_NOT_AVAILABLE
= 2**64-1). Writes OUTDIR/nvml-pidns.json.
"""
import json, os, subprocess, sys, time

OUT = sys.argv[1] if len(sys.argv) > 1 else "/tmp"
GS = os.path.abspath(".device-carry/gpuslice")
PY = "/opt/torch/.venv/bin/python3"
WORKER = r'''
import ctypes, json, os, torch
x = torch.empty(2**30, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize()
nvml = ctypes.CDLL("libnvidia-ml.so.1")
assert nvml.nvmlInit_v2() == 0
h = ctypes.c_void_p()
assert nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0
class P(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong), ("gi", ctypes.c_uint), ("ci", ctypes.c_uint)]
buf = (P * 64)(); n = ctypes.c_uint(64)
rc = nvml.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(n), buf)
status = open("/proc/self/status").read()
nspid = [l.split()[1:] for l in status.splitlines() if l.startswith("NSpid:")][0]
print(json.dumps({"rc": rc, "nspid": nspid, "procs": [[buf[i].pid, buf[i].used] for i in range(n.value)]}))
'''


def run(flags):
    t = time.time()
    p = subprocess.run([GS, "run", "--gpus", "0"] + flags + ["--", PY, "-c", WORKER],
                       capture_output=True, text=True, timeout=120)
    rec = {"argv": ["gpuslice", "run", "--gpus", "0"] + flags + ["--", PY, "-c", "<WORKER>"],
           "rc": p.returncode, "wall_s": round(time.time() - t, 2), "stderr_tail": p.stderr[-1500:]}
    try:
        rec["seen"] = json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        rec["stdout_tail"] = p.stdout[-1500:]
    return rec


res = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
       "driver": subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True).stdout.strip(),
       "command": " ".join(sys.argv),
       "pid_private": run([]), "pid_host": run(["--pid", "host"])}
with open(os.path.join(OUT, "nvml-pidns.json"), "w") as f:
    json.dump(res, f, indent=1)
print(json.dumps({k: v.get("seen") for k, v in res.items() if isinstance(v, dict)}))
