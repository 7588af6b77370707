#!/usr/bin/env bash
# `gpuslice bench init` on the GPU machine: CUDA start-up per
# isolation method, with the probe and with PyTorch.
#
#   scripts/device_bench_init.sh OUTDIR [probe|torch|all]
#
# Run from the repository root, as root, after scripts/device-build.sh put
# the binaries in .device-carry/. Writes under OUTDIR: bench-init-*.json and
# .svg (the probe), bench-init-torch-*.json and .svg, each run's table and
# stderr, and the machine's state before and after (nvidia-smi, leftovers).
# Runs per cell: PROBE_RUNS (default 30) and TORCH_RUNS (default 10; a torch
# run takes seconds, so 10 keeps the whole script within ten minutes).
# A failed run is kept in the JSON with its reason; bench init then exits 1,
# which this script reports and goes on.
set -uo pipefail

out=${1:?usage: scripts/device_bench_init.sh OUTDIR [probe|torch|all]}
what=${2:-all}
mkdir -p "$out"
gs=$(pwd)/.device-carry/gpuslice
probe_runs=${PROBE_RUNS:-30}
torch_runs=${TORCH_RUNS:-10}
python=${PYTHON:-python3}

if [ ! -x "$gs" ] || [ ! -x "$(pwd)/.device-carry/gpuslice-cuda-probe" ]; then
    echo "no $gs or gpuslice-cuda-probe beside it: run scripts/device-build.sh and carry .device-carry" >&2
    exit 2
fi

{
    date -u +%FT%TZ
    uname -a
    "$gs" --version
    nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,driver_version,persistence_mode,mig.mode.current --format=csv
    nvidia-smi | head -5
    "$gs" list
    "$python" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1
} >"$out/machine-before.txt" 2>&1

# One bench: table to NAME.txt, stderr to NAME.stderr, exit code to the log.
bench() {
    local name=$1
    shift
    local start=$SECONDS
    echo "== $gs bench init $*" | tee -a "$out/device_bench_init.log"
    "$gs" bench init "$@" --out "$out" >"$out/$name.txt" 2>"$out/$name.stderr"
    local rc=$?
    echo "   rc=$rc in $((SECONDS - start)) s" | tee -a "$out/device_bench_init.log"
    cat "$out/$name.txt"
    tail -n 5 "$out/$name.stderr"
}

case $what in
probe | all) bench bench-init-probe --runs "$probe_runs" ;;
esac
case $what in
torch | all) bench bench-init-torch --workload torch --python "$python" --runs "$torch_runs" --timeout 120 ;;
esac
case $what in
probe | torch | all) ;;
*)
    echo "unknown part $what (probe, torch or all)" >&2
    exit 2
    ;;
esac

{
    date -u +%FT%TZ
    nvidia-smi --query-gpu=index,persistence_mode --format=csv
    echo "gpuslice cgroups left:"
    ls -d /sys/fs/cgroup/gpuslice/* 2>/dev/null
    echo "gpuslice mounts left: $(grep -c gpuslice /proc/self/mountinfo)"
    ls -l /dev/nvidia*
} >"$out/machine-after.txt" 2>&1
ls -l "$out"
