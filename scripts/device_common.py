"""Pieces shared by the scripts/device_*.py runs on the GPU machine.

The scripts run as `python3 scripts/device_X.py ...`, so this module is on
their import path (the script's own directory). Nothing here touches the
GPU: the code strings are run by the scripts' child processes.
"""
import json
import os
import subprocess
import sys
import time


# The PyTorch interpreter, and the release binaries device-build.sh left
# in the carry directory (`GPUSLICE_CARRY`, else .device-carry).
TORCH_PY = os.environ.get("TORCH_PY", "/opt/torch/.venv/bin/python3")
CARRY = os.path.abspath(os.environ.get("GPUSLICE_CARRY", ".device-carry"))
GPUSLICE = os.path.join(CARRY, "gpuslice")


def out_dir(default):
    """The output directory (the first argument, else `default`), made."""
    out = sys.argv[1] if len(sys.argv) > 1 else default
    if out.startswith("-"):
        sys.exit(f"usage: {sys.argv[0]} [OUTDIR] (an output directory, not {out!r})")
    os.makedirs(out, exist_ok=True)
    return out


def run_record(**fields):
    """The head of a result file: the exact command and the UTC date, then
    `fields`."""
    rec = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    rec.update(fields)
    return rec


def record_driver(rec):
    """nvidia-smi's driver version and GPU name as rec["driver"]; an error
    starting it goes to rec["errors"]."""
    try:
        rec["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,name", "--format=csv,noheader"],
                                       capture_output=True, text=True).stdout.strip()
    except OSError as e:
        rec["errors"].append(repr(e))


def write_json(obj, path, **dump_args):
    """Writes `obj` as JSON to `path` through a temporary file, so that a
    run cut short leaves the last complete file."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, **dump_args)
    os.replace(tmp, path)


class Results(dict):
    """A run's result record; save() writes it whole to `path` (sorted,
    indent 2) after each step, so that a run cut short leaves what it had."""

    def __init__(self):
        super().__init__()
        self.path = None

    def save(self):
        write_json(self, self.path, indent=2, sort_keys=True)


def save_timed(rec, t0, path):
    """Records the seconds since `t0` in `rec` and writes it (indent 1)."""
    rec["elapsed_s"] = round(time.time() - t0, 1)
    write_json(rec, path, indent=1)


def budget_left(t0, budget_s):
    """Seconds left of a run's budget that started at `t0`."""
    return budget_s - (time.time() - t0)


def results(text):
    """The JSON of every `RESULT {...}` line a worker printed."""
    return [json.loads(l[7:]) for l in text.splitlines() if l.startswith("RESULT ")]


def last_json(rec):
    """The last line of `rec["stdout"]` that is JSON, else None."""
    for line in reversed(rec.get("stdout", "").splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def nvml_by_pid():
    """GPU 0's compute processes as NVML lists them on the host: pid ->
    bytes used (pynvml)."""
    import pynvml
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    return {p.pid: (p.usedGpuMemory or 0) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)}


# Each prints one JSON line: the GPUs it sees and, when there is one, a
# result (2048.0).
FRAMEWORKS = {
    "torch": "import json,torch;n=torch.cuda.device_count();"
    "r=float((torch.ones(1024,device='cuda')*2).sum()) if n else None;"
    "print(json.dumps({'devices':n,'result':r}))",
    "jax": "import json,jax;d=[x for x in jax.devices() if x.platform=='gpu'];"
    "r=float(jax.numpy.ones(1024).sum()*2) if d else None;"
    "print(json.dumps({'devices':len(d),'result':r}))",
    "cupy": "import json,cupy;\ntry:\n n=cupy.cuda.runtime.getDeviceCount()\nexcept Exception as e:\n n=0\n"
    "r=float((cupy.ones(1024)*2).sum()) if n else None\nprint(json.dumps({'devices':n,'result':r}))",
}

# Start of a ctypes client of the driver (no framework): libcuda as `cu`,
# device 0 as `dev`, its primary context retained as `ctx` (not yet made
# current) with the call's result in `rc_ctx`.
CU_PRIMARY_CTX = r'''
import ctypes
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
dev = ctypes.c_int()
cu.cuDeviceGet(ctypes.byref(dev), 0)
ctx = ctypes.c_void_p()
rc_ctx = cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
'''

# The tensors of the compute measurements on `dev`: 4096^2 bf16 GEMM
# operands `a`, `b` and output `c`, and a 32 Mi-element bf16 vector `x`
# for small element-wise kernels.
GEMM_TENSORS = r'''
N = 4096
a = torch.randn(N, N, device=dev, dtype=torch.bfloat16)
b = torch.randn(N, N, device=dev, dtype=torch.bfloat16)
c = torch.empty(N, N, device=dev, dtype=torch.bfloat16)
x = torch.randn(32 << 20, device=dev, dtype=torch.bfloat16)
'''
