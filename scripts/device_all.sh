#!/usr/bin/env bash
# What the GPU machine verifies, in as few calls as the 10-minute limit allows:
#   scripts/device_all.sh OUTDIR isolation   # issue 2 checks + bench launch, issue 3 bench init (probe, torch)
#   scripts/device_all.sh OUTDIR shim        # issue 4 checks and overheads
#   scripts/device_all.sh OUTDIR doctor      # issue 8: gpuslice doctor --json (OUTDIR/doctor.json)
#   scripts/device_all.sh OUTDIR cdi         # issue 10: cdi generate/check, host paths, CUDA via run
#   scripts/device_all.sh OUTDIR exporter    # issue 7: exporter during a capped GEMM, idle CPU (~100 s)
# Run from the repo root as root after scripts/device-build.sh. Each part is
# bounded; everything lands in OUTDIR/<part>.tgz (the device tool brings
# back few files) plus the isolation summary.
set -u
out=${1:?usage: scripts/device_all.sh OUTDIR isolation|shim|doctor}
what=${2:-isolation}
work=$(mktemp -d)
part() { echo "== $* ($(date -u +%T))"; timeout -s KILL "$@"; echo "   rc=$?"; }
case $what in
isolation)
    part 120 python3 scripts/device_verify.py "$work"
    part 150 bash scripts/device_bench_init.sh "$work/init" probe
    TORCH_RUNS=${TORCH_RUNS:-6} part 260 bash scripts/device_bench_init.sh "$work/init" torch
    cp "$work/isolation.json" "$out/" 2>/dev/null
    ;;
shim)
    part 540 python3 scripts/device_shim.py "$work/shim" --rounds "${ROUNDS:-3}"
    ;;
cdi)
    part 60 python3 scripts/device_cdi.py "$work"
    cp "$work/cdi.json" "$out/" 2>/dev/null
    ;;
exporter)
    part 120 python3 scripts/device_exporter.py "$work"
    cp "$work/exporter.json" "$out/" 2>/dev/null
    ;;
doctor)
    # Exit 0 all pass, 1 warnings, 2 failures: the verdict is in the JSON.
    echo "== doctor ($(date -u +%T))"
    timeout -s KILL 60 .device-carry/gpuslice doctor --json > "$work/doctor.json"; echo "   rc=$?"
    cp "$work/doctor.json" "$out/" 2>/dev/null
    timeout -s KILL 60 .device-carry/gpuslice doctor
    ;;
*) echo "unknown part $what" >&2; exit 2 ;;
esac
tar czf "$out/$what.tgz" -C "$work" .
ls -la "$out"
