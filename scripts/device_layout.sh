#!/usr/bin/env bash
# On the GPU machine: the installed layout works with the real
# driver. scripts/install.sh (run by scripts/device-build.sh) named the shim
# libgpuslice.so in .device-carry/; `gpuslice run --memory` must find it
# next to the binary and preload it, and `bench launch` (now in crate
# gpuslice-bench) must still run. Writes OUTDIR/layout.json (and
# OUTDIR/layout-launch.json, the benchmark's own document).
#   bash scripts/device_layout.sh OUTDIR      (as root, from the repo root)
set -u
out=${1:?usage: scripts/device_layout.sh OUTDIR}
mkdir -p "$out"
carry="$PWD/.device-carry"
probe_cmd="$carry/gpuslice run --gpus 0 --memory 1GiB -- $carry/gpuslice-cuda-probe"
timeout -s KILL 60 $probe_cmd >"$out/layout-probe.txt" 2>&1
probe_rc=$?
maps_cmd="$carry/gpuslice run --gpus 0 --memory 1GiB -- cat /proc/self/maps"
timeout -s KILL 30 $maps_cmd >"$out/layout-maps.txt" 2>&1
maps_rc=$?
launch_cmd="$carry/gpuslice-bench launch --runs 50 --gpus 0 --json"
PATH="$carry:$PATH" timeout -s KILL 120 $launch_cmd >"$out/layout-launch.json" 2>"$out/layout-launch.err"
launch_rc=$?
OUT="$out" CARRY="$carry" PROBE_CMD="$probe_cmd" PROBE_RC=$probe_rc MAPS_CMD="$maps_cmd" \
MAPS_RC=$maps_rc LAUNCH_CMD="$launch_cmd" LAUNCH_RC=$launch_rc python3 - <<'PY'
import datetime, json, os
e, out = os.environ, os.environ["OUT"]
def text(f):
    try: return open(os.path.join(out, f)).read()
    except OSError: return ""
def driver():
    try: return open("/proc/driver/nvidia/version").readline().strip()
    except OSError: return None
probe = text("layout-probe.txt").strip().splitlines()
maps = text("layout-maps.txt")
try: launch = json.loads(text("layout-launch.json"))
except ValueError: launch = None
doc = {
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "driver": driver(),
    "shim_installed_as_libgpuslice_so": os.path.isfile(os.path.join(e["CARRY"], "libgpuslice.so")),
    "capped_probe": {"command": e["PROBE_CMD"], "rc": int(e["PROBE_RC"]),
                     "last_line": probe[-1] if probe else None},
    "shim_mapped_in_slice": {"command": e["MAPS_CMD"], "rc": int(e["MAPS_RC"]),
                             "libgpuslice_so_mappings": maps.count("/libgpuslice.so")},
    "bench_launch": {"command": e["LAUNCH_CMD"], "rc": int(e["LAUNCH_RC"]),
                     "variants": [v.get("name") for v in (launch or {}).get("variants", [])],
                     "stderr": text("layout-launch.err")[-500:]},
}
json.dump(doc, open(os.path.join(out, "layout.json"), "w"), indent=2)
print(json.dumps(doc, indent=2))
PY
