#!/usr/bin/env python3
"""On the real GPU: the memory cap holds in physical memory.

    python3 scripts/device_memphys.py OUT_DIR [--only procs,torch,clients,arrays,legacy]

Run as root from the repository root after scripts/device-build.sh. Writes
OUT_DIR/memphys.json (rewritten after every case: a run cut short keeps
what it measured), with the exact command, date and driver version.

  procs    1, 2, 5 and 8 processes in one 20 GiB slice (one `gpuslice
           run`), each creating a context and asking for 4 GiB with
           cuMemAlloc (ctypes, no framework). Per case: `cap_mib`,
           `physical_used_mib` (the host-side NVML sum, pynvml, over the
           slice's processes, found as the launcher's descendants),
           which requests were refused (context or allocation), and what
           the ledger holds. Must hold: physical_used_mib <= cap_mib.
  torch    one PyTorch process allocates 256 MiB blocks, then 16 MiB ones,
           until refused: obtained >= cap - its measured context - 1 %;
           get_device_properties(0).total_memory == cap; mem_get_info.
  clients  the client matrix, each allocating until refused, with the
           physical use (NVML) at the end: torch default and
           expandable_segments, a CUDA-graph pool, JAX, CuPy default and
           cudaMallocAsync pools, numba, cuda-python cuMemAlloc and
           cuMemCreate. Each: physical use <= cap, something obtained,
           and the total it reports (mem_get_info, cuDeviceTotalMem) ==
           cap where it reports one (`total_is_cap`).
  arrays   without gpuslice: what the real driver reports for CUDA
           arrays (cuArray3DCreate plain and with
           CUDA_ARRAY3D_DEFERRED_MAPPING, cuMipmappedArrayCreate): the
           drop in cuMemGetInfo's free memory, and what
           cuArrayGetMemoryRequirements / cuMipmappedArrayGetMemoryRequirements
           return (rc, size, alignment), next to the shim's estimate
           (texels x channels x element size). `pass`: for every array
           the shim's charge (`shim_charge`: 0 for deferred mapping, else
           the estimate rounded up to 2 MiB) covers the drop in free
           memory (`covered`).
  legacy   the pre-3.2 names the shim does not interpose (`cuMemAlloc`,
           `cuMemFree`: 32-bit pointer and size), looked up with dlsym
           and called through ctypes, bare and under `--memory 20GiB`:
           1 GiB at a time until refused (at most 40). Recorded, not
           judged: `escapes_cap` true means the old names pass the cap
           on this driver (a gap docs/shim.md lists).
  dlvsym   dlvsym on libcuda and libnvidia-ml (allocation and memory-info
           names, several versions, the library's handle and
           RTLD_DEFAULT), bare and under `--memory 20GiB`: each lookup's
           defining file. `pass`: under gpuslice no lookup yields a
           function that is not the shim's (the driver's libraries define
           no symbol versions, so glibc finds none: `found` is empty).
  pooldestroy  in a 20 GiB slice, a created pool with 1 GiB outstanding is
           destroyed, then the allocation freed: the slice's free memory
           (cuMemGetInfo) and the host's NVML figure after each step.
           `pass`: free memory does not grow at the destroy
           (`destroy_kept_charge`) and is back after the free
           (`free_released`); `driver_held_after_destroy` records that
           the driver kept the memory (bench/results/mempool-*).

Top-level `pass`: every procs case within the cap, torch's usable memory
and total_memory == cap, every client within the cap with memory obtained
and total == cap where reported (CuPy's cudaMallocAsync pool included: its
32 MiB growth steps are held before each allocation), dlvsym and
pooldestroy passing.
"""

import datetime
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from device_common import CU_PRIMARY_CTX, Results, nvml_by_pid  # noqa: E402

ROOT = os.getcwd()
GPUSLICE = os.path.join(ROOT, ".device-carry", "gpuslice")
PY = sys.executable
MIB = 1 << 20
CAP = "20GiB"
CAP_BYTES = 20 << 30
RESULT = Results()


def descendants(root):
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = open(f"/proc/{d}/stat").read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def physical(launcher_pid):
    """Host-side NVML sum over the launcher's descendants, and the list."""
    use = nvml_by_pid()
    mine = {p: use[p] for p in descendants(launcher_pid) if p in use}
    return sum(mine.values()), mine


def finish(p, rec, timeout, tail):
    """Waits up to `timeout` s for the client `p` (then kills it) and
    records its return code and the last `tail` characters of its stderr."""
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
    rec["rc"] = p.returncode
    rec["stderr_tail"] = p.stderr.read()[-tail:]


# One worker of PROCS: creates a context and asks for 4 GiB, reports,
# and holds them until told to end.
PROCS_WORKER = r'''
import ctypes, json, sys''' + CU_PRIMARY_CTX + r'''rc_alloc = -1
if rc_ctx == 0:
    cu.cuCtxSetCurrent(ctx)
    p = ctypes.c_uint64()
    rc_alloc = cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(4 << 30))
print(json.dumps({"ctx": rc_ctx, "alloc": rc_alloc}), flush=True)
sys.stdin.readline()
'''

# A slice's parent: starts N workers one after the other, reports, and
# holds them until told to end.
PROCS = r'''
import ctypes, json, subprocess, sys
n = int(sys.argv[1])
worker = PROCS_WORKER
ws, res = [], []
for i in range(n):
    w = subprocess.Popen([sys.executable, "-c", worker], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    r = json.loads(w.stdout.readline())
    r["pid_in_slice"] = w.pid
    res.append(r)
    ws.append(w)
print("READY " + json.dumps(res), flush=True)
sys.stdin.readline()
for w in ws:
    w.stdin.write("\n"); w.stdin.flush(); w.wait()
'''.replace("PROCS_WORKER", repr(PROCS_WORKER))


def case_procs(n):
    cmd = [GPUSLICE, "run", "--gpus", "0", "--memory", CAP, "--", PY, "-c", PROCS, str(n)]
    t = time.monotonic()
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rec = {"command": cmd[:-3] + ["<PROCS>", str(n)], "cap_mib": CAP_BYTES // MIB}
    line = ""
    while not line.startswith("READY") and p.poll() is None and time.monotonic() - t < 90:
        line = p.stdout.readline()
    if line.startswith("READY"):
        time.sleep(1.0)  # the background context measurement settles
        rec["requests"] = json.loads(line[6:])
        total, per = physical(p.pid)
        rec["physical_used_mib"] = total / MIB
        rec["physical_per_process_mib"] = {str(k): v / MIB for k, v in per.items()}
        rec["refused"] = [i for i, r in enumerate(rec["requests"]) if r["alloc"] != 0]
        rec["contexts_refused"] = [i for i, r in enumerate(rec["requests"]) if r["ctx"] != 0]
        s = subprocess.run([GPUSLICE, "slices", "--json"], capture_output=True, text=True)
        try:
            sl = json.loads(s.stdout)["slices"]
            rec["ledger_used_mib"] = [d["used_bytes"] / MIB for x in sl for d in x["devices"]]
        except (ValueError, KeyError):
            rec["slices_raw"] = s.stdout[-2000:]
        rec["pass"] = rec["physical_used_mib"] <= rec["cap_mib"]
        p.stdin.write("\n")
        p.stdin.flush()
    finish(p, rec, 30, 2000)
    rec["wall_s"] = time.monotonic() - t
    return rec


# A client's allocation loop: blocks of each size in turn (the largest
# first) until one is refused, kept alive in `keep`.
FILL = r'''
def fill(alloc, refused, sizes=(256 << 20, 16 << 20)):
    keep, got = [], 0
    for size in sizes:
        while True:
            try:
                keep.append(alloc(size)); got += size
            except refused:
                break
    return keep, got
'''

# Clients: each allocates until refused and prints what it obtained, then
# waits on stdin so the host can read its physical use.
CLIENTS = {
    "torch_default": ({}, r'''
import torch, json, sys''' + FILL + r'''
blocks, got = fill(lambda size: torch.empty(size, dtype=torch.uint8, device="cuda"),
                   (torch.OutOfMemoryError, RuntimeError))
free, total = torch.cuda.mem_get_info()
print(json.dumps({"got": got, "total": total, "props_total": torch.cuda.get_device_properties(0).total_memory,
                  "reserved": torch.cuda.memory_reserved()}), flush=True)
sys.stdin.readline()
'''),
    "torch_expandable": ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, None),
    "torch_graph_pool": ({}, r'''
import torch, json, sys
got = 0
g = torch.cuda.CUDAGraph(); keep = []
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    for i in range(200):
        try:
            g2 = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g2):
                keep.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
            g2.replay(); keep.append(g2); got += 256 << 20
        except Exception as e:
            err = str(e)[:200]
            break
torch.cuda.synchronize()
free, total = torch.cuda.mem_get_info()
print(json.dumps({"got": got, "total": total}), flush=True)
sys.stdin.readline()
'''),
    "jax": ({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}, r'''
import jax, jax.numpy as jnp, json, sys''' + FILL + r'''
def zeros(size):
    a = jnp.zeros((size,), dtype=jnp.uint8); a.block_until_ready()
    return a
keep, got = fill(zeros, Exception)
stats = jax.devices()[0].memory_stats() or {}
print(json.dumps({"got": got, "total": stats.get("bytes_limit")}), flush=True)
sys.stdin.readline()
'''),
    "jax_prealloc": ({}, r'''
import jax, jax.numpy as jnp, json, sys
stats = jax.devices()[0].memory_stats() or {}
print(json.dumps({"got": stats.get("bytes_limit"), "total": stats.get("bytes_limit")}), flush=True)
sys.stdin.readline()
'''),
    "cupy_default": ({}, r'''
import cupy, json, sys''' + FILL + r'''
keep, got = fill(lambda size: cupy.empty(size, dtype=cupy.uint8), cupy.cuda.memory.OutOfMemoryError)
free, total = cupy.cuda.runtime.memGetInfo()
print(json.dumps({"got": got, "total": total}), flush=True)
sys.stdin.readline()
'''),
    "cupy_async": ({}, r'''
import cupy, json, sys''' + FILL + r'''
cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)
keep, got = fill(lambda size: cupy.empty(size, dtype=cupy.uint8), Exception)
free, total = cupy.cuda.runtime.memGetInfo()
print(json.dumps({"got": got, "total": total}), flush=True)
sys.stdin.readline()
'''),
    "numba": ({}, r'''
from numba import cuda
import numpy as np, json, sys''' + FILL + r'''
keep, got = fill(lambda size: cuda.device_array(size, dtype=np.uint8), Exception)
free, total = cuda.current_context().get_memory_info()
print(json.dumps({"got": got, "total": total}), flush=True)
sys.stdin.readline()
'''),
    "cuda_python_alloc": ({}, r'''
from cuda.bindings import driver as d
import json, sys''' + FILL + r'''
d.cuInit(0); _, dev = d.cuDeviceGet(0); _, ctx = d.cuDevicePrimaryCtxRetain(dev); d.cuCtxSetCurrent(ctx)
def mem_alloc(size):
    err, p = d.cuMemAlloc(size)
    if err != d.CUresult.CUDA_SUCCESS:
        raise MemoryError(err)
    return p
keep, got = fill(mem_alloc, MemoryError)
_, free, total = d.cuMemGetInfo()
_, tot = d.cuDeviceTotalMem(dev)
print(json.dumps({"got": got, "total": total, "device_total": tot}), flush=True)
sys.stdin.readline()
'''),
    "cuda_python_create": ({}, r'''
from cuda.bindings import driver as d
import json, sys''' + FILL + r'''
d.cuInit(0); _, dev = d.cuDeviceGet(0); _, ctx = d.cuDevicePrimaryCtxRetain(dev); d.cuCtxSetCurrent(ctx)
prop = d.CUmemAllocationProp()
prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
prop.location.id = 0
def mem_create(size):
    err, h = d.cuMemCreate(size, prop, 0)
    if err != d.CUresult.CUDA_SUCCESS:
        raise MemoryError(err)
    return h
keep, got = fill(mem_create, MemoryError, sizes=(256 << 20, 32 << 20))
_, free, total = d.cuMemGetInfo()
print(json.dumps({"got": got, "total": total}), flush=True)
sys.stdin.readline()
'''),
}
CLIENTS["torch_expandable"] = (CLIENTS["torch_expandable"][0], CLIENTS["torch_default"][1])

# What the real driver holds for arrays and what it reports (bare, no
# gpuslice). Every call guarded: a field that fails records its error.
ARRAYS = r'''
from cuda.bindings import driver as d
import json
d.cuInit(0); _, dev = d.cuDeviceGet(0); _, ctx = d.cuDevicePrimaryCtxRetain(dev); d.cuCtxSetCurrent(ctx)
U8 = d.CUarray_format.CU_AD_FORMAT_UNSIGNED_INT8
F32 = d.CUarray_format.CU_AD_FORMAT_FLOAT
DEFERRED = int(getattr(d, "CUDA_ARRAY3D_DEFERRED_MAPPING", 0x80))
def free():
    d.cuCtxSynchronize()
    return d.cuMemGetInfo()[1]
def desc(w, h, depth, fmt, ch, flags):
    x = d.CUDA_ARRAY3D_DESCRIPTOR()
    x.Width, x.Height, x.Depth, x.Format, x.NumChannels, x.Flags = w, h, depth, fmt, ch, flags
    return x
cases = [
    ("2d_4096x4096_u8x1", 4096, 4096, 0, U8, 1, 1, 1),
    ("2d_8192x8192_f32x4", 8192, 8192, 0, F32, 4, 1, 4 * 4),
    ("3d_512x512x64_f32x1", 512, 512, 64, F32, 1, 1, 4),
    ("1d_65536_u8x4", 65536, 0, 0, U8, 4, 1, 4),
]
out = []
def measure(rec, create, requirements, destroy):
    """Creates one array with create(), recording the drop in free memory,
    what requirements(array, dev) reports and what destroy(array) gives
    back; appends rec to out."""
    try:
        before = free()
        err, arr = create()
        rec["rc_create"] = int(err)
        if err == d.CUresult.CUDA_SUCCESS:
            rec["free_drop"] = before - free()
            r = requirements(arr, dev)
            rec["rc_requirements"] = int(r[0])
            if r[0] == d.CUresult.CUDA_SUCCESS:
                rec["requirements_size"] = int(r[1].size)
                rec["requirements_alignment"] = int(r[1].alignment)
            destroy(arr)
            rec["free_back"] = free() - before
    except Exception as e:
        rec["error"] = repr(e)[:300]
    out.append(rec)
for name, w, h, depth, fmt, ch, _, elem in cases:
    texels = w * max(h, 1) * max(depth, 1)
    for flags, tag in ((0, ""), (DEFERRED, "_deferred")):
        measure({"case": name + tag, "flags": flags, "estimate": texels * elem},
                lambda: d.cuArray3DCreate(desc(w, h, depth, fmt, ch, flags)),
                d.cuArrayGetMemoryRequirements, d.cuArrayDestroy)
for flags, tag in ((0, ""), (DEFERRED, "_deferred")):
    measure({"case": "mipmapped_2048x2048_f32x4_levels8" + tag, "flags": flags,
             "estimate": sum((2048 >> l) ** 2 * 16 for l in range(8))},
            lambda: d.cuMipmappedArrayCreate(desc(2048, 2048, 0, F32, 4, flags), 8),
            d.cuMipmappedArrayGetMemoryRequirements, d.cuMipmappedArrayDestroy)
print(json.dumps(out))
'''


# The old 32-bit-ABI names, straight from libcuda (ctypes uses dlsym).
LEGACY = r'''
import ctypes, json
cu = ctypes.CDLL("libcuda.so.1")
for n in ("cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent", "cuMemAlloc", "cuMemFree",
          "cuMemGetInfo_v2"):
    getattr(cu, n).restype = ctypes.c_int
assert cu.cuInit(0) == 0
dev = ctypes.c_int(); cu.cuDeviceGet(ctypes.byref(dev), 0)
ctx = ctypes.c_void_p(); cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev); cu.cuCtxSetCurrent(ctx)
ptrs, rcs = [], []
for _ in range(40):
    p = ctypes.c_uint(0)
    rc = cu.cuMemAlloc(ctypes.byref(p), ctypes.c_uint(1 << 30))
    rcs.append(rc)
    if rc != 0:
        break
    ptrs.append(p.value)
free, total = ctypes.c_size_t(), ctypes.c_size_t()
cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
print(json.dumps({"gib_obtained": len(ptrs), "rcs": rcs[-3:], "first_ptrs": ptrs[:3],
                  "free": free.value, "total": total.value}), flush=True)
for p in ptrs:
    cu.cuMemFree(ctypes.c_uint(p))
'''


# dlvsym on the driver's libraries: each name under several versions, in
# the library's handle and in RTLD_DEFAULT, with the file that defines
# what came back (dladdr). Not the empty version: glibc dereferences a
# null version name for it.
DLVSYM = r'''
import ctypes, json
libc = ctypes.CDLL(None)
libc.dlopen.restype = libc.dlvsym.restype = ctypes.c_void_p
libc.dlopen.argtypes = [ctypes.c_char_p, ctypes.c_int]
libc.dlvsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
class DlInfo(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p), ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]
def file_of(p):
    info = DlInfo()
    if not p or not libc.dladdr(ctypes.c_void_p(p), ctypes.byref(info)):
        return ""
    return (info.fname or b"").decode()
out = []
for lib, names in (("libcuda.so.1", ("cuMemAlloc_v2", "cuMemFree_v2", "cuMemAllocAsync", "cuMemCreate",
                                      "cuGetProcAddress_v2", "cuDeviceTotalMem_v2", "cuMemGetInfo_v2")),
                   ("libnvidia-ml.so.1", ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2"))):
    h = libc.dlopen(lib.encode(), 2 | 0x100)  # RTLD_NOW | RTLD_GLOBAL
    for name in names:
        for which, handle in (("handle", h), ("default", None)):
            for version in ("GLIBC_2.2.5", "GLIBC_2.34", "CUDA_12.0", "CUDA_13.0", lib):
                p = libc.dlvsym(handle, name.encode(), version.encode())
                out.append({"lib": lib, "name": name, "handle": which, "version": version, "file": file_of(p)})
print(json.dumps(out))
'''


def bare_and_capped(code, mark):
    """Runs the Python `code` bare, then in a slice capped at CAP; yields
    for each its name ("bare", "gpuslice"), a record of its exit code and
    the tail of its stderr, and the last line of its stdout that starts
    with `mark`, parsed (None where there is none)."""
    for name, cmd in (("bare", [PY, "-c", code]),
                      ("gpuslice", [GPUSLICE, "run", "--gpus", "0", "--memory", CAP, "--", PY, "-c", code])):
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        rec = {"rc": p.returncode, "stderr_tail": p.stderr[-1000:]}
        lines = [l for l in p.stdout.splitlines() if l.startswith(mark)]
        yield name, rec, json.loads(lines[-1]) if lines else None


def dlvsym():
    """Whether dlvsym finds any driver function (bare) and whether, under
    the shim, it finds one that is not the shim's: `pass` when it never
    hands out the driver's own function under gpuslice."""
    out = {}
    for name, rec, lookups in bare_and_capped(DLVSYM, "["):
        if lookups is not None:
            rec["lookups"] = lookups
            rec["found"] = [l for l in lookups if l["file"]]
        out[name] = rec
    found = out["gpuslice"].get("found")
    out["pass"] = found is not None and all("gpuslice" in l["file"] for l in found)
    return out


# A pool destroyed with 1 GiB outstanding, then the allocation freed, in a
# slice: the slice's view of free memory (cuMemGetInfo, the cap minus the
# ledger) after each step, and the host's NVML figure for the process.
POOLDESTROY = r'''
import ctypes, json, os, sys, time
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
dev = ctypes.c_int(); cu.cuDeviceGet(ctypes.byref(dev), 0)
ctx = ctypes.c_void_p(); cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev); cu.cuCtxSetCurrent(ctx)
class Props(ctypes.Structure):
    _fields_ = [("allocType", ctypes.c_int), ("handleTypes", ctypes.c_int), ("locType", ctypes.c_int), ("locId", ctypes.c_int),
                ("win32", ctypes.c_void_p), ("maxSize", ctypes.c_size_t), ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 54)]
def free():
    cu.cuCtxSynchronize()
    f, t = ctypes.c_size_t(), ctypes.c_size_t()
    cu.cuMemGetInfo_v2(ctypes.byref(f), ctypes.byref(t))
    return f.value
def step(name):
    print(json.dumps({"step": name, "free": free()}), flush=True)
    sys.stdin.readline()
pr = Props(); pr.allocType = 1; pr.locType = 1; pr.locId = 0
pool, p = ctypes.c_void_p(), ctypes.c_uint64()
time.sleep(0.5)  # the context's measurement replaces its estimate first
step("before")
assert cu.cuMemPoolCreate(ctypes.byref(pool), ctypes.byref(pr)) == 0
assert cu.cuMemAllocFromPoolAsync(ctypes.byref(p), ctypes.c_size_t(1 << 30), pool, None) == 0
step("allocated")
assert cu.cuMemPoolDestroy(pool) == 0
step("destroyed")
assert cu.cuMemFreeAsync(p, None) == 0
step("freed")
'''


def pooldestroy():
    """`pass`: the slice's free memory does not grow at the destroy (the
    charge stays while the driver holds the memory) and comes back after
    the free; the host's NVML figure shows what the driver held."""
    cmd = [GPUSLICE, "run", "--gpus", "0", "--memory", CAP, "--", PY, "-c", POOLDESTROY]
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rec = {"command": cmd[:-1] + ["<POOLDESTROY>"], "steps": {}}
    t = time.monotonic()
    while p.poll() is None and time.monotonic() - t < 60 and len(rec["steps"]) < 4:
        line = p.stdout.readline()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        r["physical_mib"] = physical(p.pid)[0] / MIB
        rec["steps"][r["step"]] = r
        p.stdin.write("\n")
        p.stdin.flush()
    finish(p, rec, 20, 1000)
    st = rec["steps"]
    if len(st) == 4:
        f = {k: v["free"] / MIB for k, v in st.items()}
        rec["destroy_kept_charge"] = f["destroyed"] <= f["allocated"] + 1
        rec["free_released"] = f["freed"] >= f["before"] - 64
        rec["driver_held_after_destroy"] = st["destroyed"]["physical_mib"] >= st["allocated"]["physical_mib"] - 1
        rec["pass"] = rec["destroy_kept_charge"] and rec["free_released"]
    else:
        rec["pass"] = False
    return rec


def legacy():
    out = {}
    for name, rec, last in bare_and_capped(LEGACY, "{"):
        rec.update(last or {})
        out[name] = rec
    got = out["gpuslice"].get("gib_obtained")
    out["escapes_cap"] = got is not None and got > CAP_BYTES >> 30
    return out


def arrays():
    p = subprocess.run([PY, "-c", ARRAYS], capture_output=True, text=True, timeout=60)
    rec = {"command": [PY, "-c", "<ARRAYS>"], "rc": p.returncode, "stderr_tail": p.stderr[-1500:]}
    lines = [l for l in p.stdout.splitlines() if l.startswith("[")]
    if lines:
        rec["cases"] = json.loads(lines[-1])
        # What the shim charges: nothing for a deferred-mapping array, else
        # the estimate rounded up to 2 MiB (the driver reports no
        # requirements for plain arrays on the H200).
        for c in rec["cases"]:
            if "free_drop" in c:
                deferred = c.get("flags", 0) & 0x80
                c["shim_charge"] = 0 if deferred else -(-c["estimate"] // (2 * MIB)) * 2 * MIB
                c["covered"] = c["shim_charge"] >= c["free_drop"]
        rec["pass"] = bool(rec["cases"]) and all(c.get("covered") for c in rec["cases"])
    return rec


def verdict():
    """The top-level pass (see the module docs) and what failed."""
    failed = []
    procs = RESULT.get("procs", {})
    for n in ("1", "2", "5", "8"):
        if not procs.get(n, {}).get("pass"):
            failed.append("procs " + n)
    torch = RESULT.get("torch", {})
    if not (torch.get("usable_pass") and torch.get("total_is_cap") and torch.get("pass")):
        failed.append("torch")
    for name in CLIENTS:
        if name == "torch_default":
            continue
        c = RESULT.get("clients", {}).get(name, {})
        if not (c.get("pass") and c.get("got_mib", 0) > 0 and c.get("total_is_cap", True)):
            failed.append("client " + name)
    for part in ("arrays", "dlvsym", "pooldestroy"):
        if part in RESULT and not RESULT[part].get("pass"):
            failed.append(part)
    return failed


def client(name, timeout=75):
    extra, code = CLIENTS[name]
    env = dict(os.environ, **extra)
    cmd = [GPUSLICE, "run", "--gpus", "0", "--memory", CAP, "--", PY, "-c", code]
    t = time.monotonic()
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    rec = {"command": cmd[:-1] + ["<" + name + ">"], "env": extra, "cap_mib": CAP_BYTES // MIB}
    line = ""
    while p.poll() is None and time.monotonic() - t < timeout:
        line = p.stdout.readline()
        if line.startswith("{"):
            break
    if line.startswith("{"):
        rec.update(json.loads(line))
        total, per = physical(p.pid)
        rec["physical_used_mib"] = total / MIB
        rec["got_mib"] = (rec.get("got") or 0) / MIB
        rec["pass"] = rec["physical_used_mib"] <= rec["cap_mib"]
        # JAX's bytes_limit is its own budget, not the device's total.
        totals = [rec.get(k) for k in ("total", "device_total", "props_total")
                  if not name.startswith("jax") and rec.get(k) is not None]
        if totals:
            rec["total_is_cap"] = all(t == CAP_BYTES for t in totals)
        p.stdin.write("\n")
        p.stdin.flush()
    finish(p, rec, 20, 1500)
    rec["wall_s"] = time.monotonic() - t
    return rec


def main():
    args = sys.argv[1:]
    os.makedirs(args[0], exist_ok=True)
    RESULT.path = os.path.join(args[0], "memphys.json")
    only = set(args[args.index("--only") + 1].split(",")) if "--only" in args else {
        "procs", "torch", "clients", "arrays", "legacy", "dlvsym", "pooldestroy"}
    RESULT.update({
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "command": " ".join([PY] + sys.argv),
        "driver": subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                                 capture_output=True, text=True).stdout.strip(),
        "cap": CAP,
    })
    RESULT.save()
    if "procs" in only:
        RESULT["procs"] = {}
        for n in (1, 2, 5, 8):
            RESULT["procs"][str(n)] = case_procs(n)
            RESULT.save()
    if "torch" in only:
        rec = client("torch_default")
        per = [v for v in [rec.get("physical_used_mib")] if v is not None]
        if per and rec.get("reserved") is not None:
            context_mib = rec["physical_used_mib"] - rec["reserved"] / MIB
            rec["context_mib"] = context_mib
            rec["usable_target_mib"] = rec["cap_mib"] - context_mib - 0.01 * rec["cap_mib"]
            rec["usable_pass"] = rec["got_mib"] >= rec["usable_target_mib"]
        rec["total_is_cap"] = rec.get("props_total") == CAP_BYTES
        RESULT["torch"] = rec
        RESULT.save()
    if "clients" in only:
        RESULT["clients"] = {}
        for name in CLIENTS:
            if name == "torch_default" and "torch" in RESULT:
                continue
            RESULT["clients"][name] = client(name)
            RESULT.save()
    for part, run, if_error in (("arrays", arrays, {}), ("legacy", legacy, {}),
                                ("dlvsym", dlvsym, {"pass": False}),
                                ("pooldestroy", pooldestroy, {"pass": False})):
        if part in only:
            try:
                RESULT[part] = run()
            except Exception as e:
                RESULT[part] = {"error": repr(e)[:300], **if_error}
            RESULT.save()
    failed = verdict()
    RESULT["failed"] = failed
    RESULT["pass"] = not failed
    RESULT.save()
    print(json.dumps({k: v for k, v in RESULT.items() if k in ("date", "driver", "pass", "failed")}))


if __name__ == "__main__":
    main()
