#!/usr/bin/env bash
# Everything the GPU machine verifies, in one call (device time is scarce):
#   scripts/device_all.sh OUTDIR
# Run from the repo root as root after scripts/device-build.sh. Each part is
# bounded; results land in OUTDIR/results.tgz (the device tool brings back
# few files) plus the isolation summary.
set -u
out=${1:?usage: scripts/device_all.sh OUTDIR}
work=$(mktemp -d)
part() { echo "== $* ($(date -u +%T))"; timeout -s KILL "$@"; echo "   rc=$?"; }
part 120 python3 scripts/device_verify.py "$work"
part 200 bash scripts/device_bench_init.sh "$work/init" probe
TORCH_RUNS=${TORCH_RUNS:-8} part 330 bash scripts/device_bench_init.sh "$work/init" torch
if [ -f scripts/device_shim.py ] && [ -f .device-carry/libgpuslice.so ]; then
    part 400 python3 scripts/device_shim.py "$work/shim"
fi
tar czf "$out/results.tgz" -C "$work" .
cp "$work/isolation.json" "$out/" 2>/dev/null
ls -la "$out"
