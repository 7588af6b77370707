#!/usr/bin/env bash
# What the GPU machine verifies, in as few calls as the 10-minute limit allows:
#   scripts/device_all.sh OUTDIR PART [PART...]
# PARTs, in the order given:
#   isolation  checks + bench launch (device_verify.py)
#   init       bench init, probe (30 runs) and torch (TORCH_RUNS, default 6)
#   shim       checks and overheads (SHIM_ONLY limits the checks, ROUNDS the rounds)
#   doctor     gpuslice doctor --json
#   cdi        cdi generate/check, host paths, CUDA via run
#   exporter   exporter during a capped GEMM, idle CPU (~100 s)
#   compute    compute share: one slice at 50/25/10/75 % (GEMM + small kernels, vs bare,
#              interleaved), two slices 30/70, a CUDA graph at 50 %, no-limit overhead (~110 s)
#   compute29  torch GEMM slices at scale, each against a bare worker of the same run:
#              10/90, 30/70, 8 x 12.5, 16 x 6.25, a 4-process 50 % slice beside a 1-process 50 %
#              one; hand-overs and fallbacks from the board (device_compute29.py, ~150 s, at most
#              240). compute29.json "pass": every slice within 1 point, the GPU >= 97 %, 0 fallbacks
#   computediag  what the GPU does under partial duty, without gpuslice (~45 s)
#   computetrace one capped worker's bucket traced across workload and share changes (~25 s)
#   memphys    physical memory cap (1/2/5/8 processes in one 20 GiB slice, host NVML sum),
#              usable memory for torch, the client matrix, array sizes the driver reports against
#              the shim's charge, the old 32-bit cuMemAlloc against the cap, dlvsym on the driver's
#              libraries, a pool destroyed with memory outstanding (device_memphys.py, ~240 s, at
#              most 300)
#   hostpid    the shim measures a context inside run's PID namespace and under
#              --pid host (host NVML lists the pid `slices` shows, the resolver gives the same pid,
#              the ledger matches NVML's figure; device_hostpid.py, ~20 s, at most 90)
#   gpt2       the torch.compile'd GPT-2 bare vs --memory 20GiB, 6 interleaved rounds, with
#              the shim's per-family call counts (device_gpt2.py, ~150 s, at most 200), then the perf ratios of
#              device_shim.py in the same run (first tensor, malloc/free, GEMM; ROUNDS=2, ~60 s)
#   gemmcap    an 8192^2 GEMM loop bare vs --memory 20GiB, two warm workers taking turns
#              (12 alternating windows of 1.5 s; device_gemm_cap.py, ~60 s). gemm-cap.json "pass"
#   integrity  env -i / su nobody capped under --memory 20GiB --compute 30, a 30 % slice
#              beside a board forger, the 30/70 pair over one shared window, GPT-2 small eager (batch 8 and 16) and compiled at 50 % with
#              the GPU-busy fraction the meter sees at 100 % (~330 s; INTEGRITY_STEPS picks steps)
#   procutil   diagnosis, no gpuslice: two GEMM processes time-sliced (one at ~30 % duty),
#              event-timed GPU time vs NVML per-process smUtil (device_procutil.py, ~40 s)
#   users      torch/jax/cupy on --gpus 0 as --user nobody, none of them see a GPU with
#              --gpus none (root and nobody), a mknod'ed alias of /dev/nvidia0 hidden by number (~60 s)
#   boundary   the adversarial suite's attacks against the real driver with --gpus none under
#              the default flags, --strict (each must hold) and --privileged (each shown to get
#              through); torch/jax/cupy see no GPU under --gpus none and work under --gpus 0 as
#              --user nobody; bench launch (default vs bwrap --unshare-pid --unshare-cgroup --dev
#              vs bare /bin/true, interleaved, 300 rounds). boundary.json "pass" (~240 s)
#   launchphases where a launch spends its time: run's variants, bwrap's and small
#              programs' beside each other, each step of gpuslice timed by its launch marks
#              (device_launch_phases.py, ~60 s)
#   layout     the installed shim name (libgpuslice.so) found and preloaded by
#              `run --memory` with the real driver; bench launch from gpuslice-bench (~40 s)
#   plugin     device plugin vs a test kubelet (v1beta1 over unix sockets): the GPU
#              whole (register, list (NUMA), Allocate run via `gpuslice run` + the probe), then
#              shared 4 ways (only gpu.shared served; two 1-replica requests packed onto it, both
#              slices run the probe at once; ledger dirs removed once PodResources drops the pods),
#              kubelet restarts, 60 s health (~90 s)
#   enforcer   the lookups the shim closed (dlvsym, libc's dlsym, dlmopen), root's enforcer
#              killing a client that allocates past the shim, slices --json against nvidia-smi, the
#              enforcer's CPU, doctor on memory partitions (device_enforcer.py, ~120 s, at most 240)
#   enforcercost root's enforcer's cost on the torch.compile'd GPT-2: both workers under
#              `run --memory 20GiB`, the enforcer on vs off (policy root_enforcer), 8 interleaved
#              rounds, steps/s ratio on/off (pass >= 0.995) and each launcher's CPU seconds
#              (device_gpt2.py --pair enforcer, ~170 s, at most 240) -> enforcer-cost.json
#   top        gpuslice top --once beside a capped slice on the real GPU (~30 s)
#   dra        the DRA driver publishes the GPU to its API test double and prepares
#              20Gi/30 and 40Gi/60 claims (bench dra-selftest); both slices started from their CDI
#              device IDs by `gpuslice run --cdi-device` with PyTorch: mem_get_info total == cap,
#              hold 20 / 40 GiB and refused beyond, 8192^2 bf16 GEMMs over one common window within
#              2 % of 1:2; bench dra --claims 1000 (prepare p99, publication after a health
#              change); the same GEMM client bare right after (each claim's fraction of the GPU);
#              unprepare from the checkpoint (device_dra.py, ~130 s, at most 170)
# Run from the repo root as root after scripts/device-build.sh. Each part is
# bounded; everything lands in OUTDIR/results.tgz (the device tool brings
# back few files), plus the small JSON summaries beside it.
set -u
out=${1:?usage: scripts/device_all.sh OUTDIR PART [PART...]}
shift
work=$(mktemp -d)
bounded() { echo "== $* ($(date -u +%T))" >&2; timeout -s KILL "$@"; echo "   rc=$?" >&2; }

part_isolation() {
    bounded 120 python3 scripts/device_verify.py "$work"
    # The private /dev overlays the host's: how many entries it has here.
    find /dev -xdev | wc -l >"$work/dev-entries.txt"
    # The isolation check's `bench launch` selects GPU 0, which on a 1-GPU
    # machine hides nothing (no mount namespace is made); `--gpus none`
    # hides the GPU: the private /dev, params overlay and BPF filter all work.
    PATH="$PWD/.device-carry:$PATH" bounded 120 .device-carry/gpuslice-bench launch --runs 300 --gpus none \
        --json >"$work/launch-none.json"
    # Where a launch spends its time (discovery is logged at debug).
    GPUSLICE_LOG_LEVEL=debug bounded 10 .device-carry/gpuslice run --gpus 0 --isolation env -- /bin/true \
        >"$work/run-debug.txt" 2>&1
    # The same launcher linked without PIE, when carried: what relocating a
    # large PIE binary costs each launch (a measurement, not the shipped build).
    if [ -x .device-carry/gpuslice-nopie ]; then
        PATH="$PWD/.device-carry:$PATH" bounded 60 .device-carry/gpuslice-nopie bench launch --runs 300 --json \
            >"$work/launch-nopie.json"
    fi
}
part_init() {
    bounded 150 bash scripts/device_bench_init.sh "$work/init" probe
    TORCH_RUNS=${TORCH_RUNS:-6} bounded 260 bash scripts/device_bench_init.sh "$work/init" torch
}
part_shim() {
    local only=()
    [ -n "${SHIM_ONLY:-}" ] && only=(--only "$SHIM_ONLY")
    bounded 470 python3 scripts/device_shim.py "$work/shim" --rounds "${ROUNDS:-3}" "${only[@]}"
}
part_memphys() {
    bounded 300 python3 scripts/device_memphys.py "$work/memphys"
    cp "$work/memphys/memphys.json" "$work/memphys.json" 2>/dev/null
}
part_hostpid() {
    bounded 90 python3 scripts/device_hostpid.py "$work/hostpid"
    cp "$work/hostpid/hostpid.json" "$work/hostpid.json" 2>/dev/null
}
part_gpt2() {
    bounded 200 python3 scripts/device_gpt2.py "$work/gpt2.json" --rounds 6 --steps 30
    bounded 90 python3 scripts/device_shim.py "$work/memphys-perf" --rounds 2 --only perf
    # The first-tensor, malloc/free and GEMM figures, bare vs capped, of this run.
    cp "$(ls -t "$work"/memphys-perf/shim-*.json 2>/dev/null | head -1)" "$work/gpt2-perf.json" 2>/dev/null
}
part_gemmcap() {
    bounded 120 python3 scripts/device_gemm_cap.py "$work/gemm-cap.json"
}
part_procutil() {
    bounded 90 python3 scripts/device_procutil.py "$work/procutil.json"
}
part_cdi() {
    bounded 60 python3 scripts/device_cdi.py "$work"
}
part_exporter() {
    bounded 120 python3 scripts/device_exporter.py "$work"
}
part_compute() {
    # Workers stay up and are driven over stdin (one torch import each);
    # the script stops itself at ~130 s and writes compute.json as it goes.
    COMPUTE_BUDGET_S=${COMPUTE_BUDGET_S:-130} bounded 145 python3 scripts/device_compute.py "$work"
}
part_compute29() {
    COMPUTE29_BUDGET_S=${COMPUTE29_BUDGET_S:-220} bounded 240 python3 scripts/device_compute29.py "$work"
    # Each slice's share against its target, beside the JSON.
    .device-carry/gpuslice-bench plot-shares "$work/compute29.json" || true
}
part_computetrace() {
    # The slice's bucket traced while one worker changes workload and share.
    bounded 120 python3 scripts/device_compute_trace.py "$work"
}
part_computediag() {
    # Plain PyTorch, no gpuslice: event cost, work per GPU-second at partial duty, SM clock.
    bounded 90 "${TORCH_PY:-/opt/torch/.venv/bin/python3}" scripts/device_compute_diag.py "$work"
}
part_integrity() {
    # Slices no tenant can tamper with: limits from root's record, the shim
    # loaded whatever the environment, the board's bound (device_integrity.py).
    INTEGRITY_BUDGET_S=${INTEGRITY_BUDGET_S:-330} bounded 350 python3 scripts/device_integrity.py "$work"
}
part_plugin() {
    # The plugin and a test kubelet in a temp dir. Phase 1, the GPU whole:
    # Allocate applied by `gpuslice run` with the CUDA probe. Phase 2, the
    # GPU shared (--replicas 4): no whole resource, two one-replica
    # requests packed onto the GPU, both slices run the probe at once, their
    # ledger dirs swept once the test PodResources drops the pods. Allocate
    # p99 over 10,000 calls per role; re-registration after 3 kubelet
    # restarts; 60 s without a health event. pass=true when every check holds.
    bounded 100 .device-carry/gpuslice-bench device-plugin-selftest --watch-secs "${WATCH_SECS:-60}" \
        --replicas 4 --bench-allocs 10000 --restarts 3 --label "H200 (real driver)" \
        --probe "$(pwd)/.device-carry/gpuslice-cuda-probe" --out "$work/plugin.json"
}
part_dra() {
    # DRA claims applied by `gpuslice run --cdi-device`; dra.json "pass", bench-dra.json.
    DRA_BUDGET_S=${DRA_BUDGET_S:-150} bounded 170 python3 scripts/device_dra.py "$work"
}
part_enforcer() {
    # The closed lookups, root's enforcer killing a process that
    # reaches the driver past the shim, slices against nvidia-smi, the
    # enforcer's CPU, doctor on partitions (device_enforcer.py, ~120 s).
    bounded 240 python3 scripts/device_enforcer.py "$work"
}
part_enforcercost() {
    bounded 240 python3 scripts/device_gpt2.py "$work/enforcer-cost.json" --pair enforcer --rounds 8 --steps 30
}
part_top() {
    # `gpuslice top --once` on the real GPU beside a capped slice
    # (2 GiB, 50 %) holding 512 MiB: the GPU's memory and utilisation from
    # NVML, the slice's cap, use and share (top-once.txt).
    local c="$PWD/.device-carry"
    ( timeout -s KILL 25 "$c/gpuslice" run --gpus 0 --memory 2GiB --compute 50 -- \
        "$c/driver_client" plain 2 hold >"$work/top-client.txt" 2>&1 & )
    sleep 6
    bounded 20 "$c/gpuslice-full" top --once >"$work/top-once.txt" 2>&1
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv >>"$work/top-once.txt" 2>&1
    sleep 20
}
part_users() {
    # Makes /dev/gpualias (a copy of /dev/nvidia0) and removes it again.
    bounded 240 python3 scripts/device_users.py "$work"
    rm -f /dev/gpualias
}
part_launchphases() {
    bounded 200 python3 scripts/device_launch_phases.py "$work/launch-phases.json" 200
    cp "$work/launch-phases.json" "$out/" 2>/dev/null
}

part_layout() {
    bounded 240 bash scripts/device_layout.sh "$work"
}
part_boundary() {
    # The attacks against the real driver (default, --strict, --privileged),
    # the frameworks, and the launch benchmark (device_boundary.py).
    bounded 330 python3 scripts/device_boundary.py "$work"
}
part_doctor() {
    # Exit 0 all pass, 1 warnings, 2 failures: the verdict is in the JSON.
    bounded 60 .device-carry/gpuslice doctor --json >"$work/doctor.json"
    timeout -s KILL 60 .device-carry/gpuslice doctor
}

# Collected after every part, so a run cut short still brings back the
# parts that finished.
collect() {
    tar czf "$out/results.tgz" -C "$work" .
    for f in launch-phases.json memphys.json hostpid.json gpt2.json gpt2-perf.json gemm-cap.json procutil.json isolation.json launch-none.json layout.json doctor.json cdi.json exporter.json plugin.json compute.json compute29.json compute29.svg compute-diag.json compute-trace.json users.json integrity.json boundary.json launch-boundary.json dra.json bench-dra.json enforcer.json enforcer-cost.json top-once.txt; do
        [ -f "$work/$f" ] && cp "$work/$f" "$out/"
    done
}

for what in "$@"; do
    if declare -F "part_$what" >/dev/null; then
        "part_$what"
        collect
    else
        echo "unknown part $what" >&2
    fi
done
ls -la "$out"
