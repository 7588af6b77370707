#!/usr/bin/env bash
# Times README.md's set-up build on this machine from a fresh clone of HEAD
# with an empty target directory (the registry's downloads are whatever
# ~/.cargo already holds), step by step, and counts what the install
# script's static relink compiles (the dependency tree must not be built
# twice). Writes bench/results/setup-time-<host>-<UTC>.json.
# Usage: scripts/setup_time.sh [CLONE_DIR]   (run on a quiet machine)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-$(mktemp -d /var/tmp/gpuslice-setup.XXXXXX)}"
rm -rf "$dir"
git clone -q "$repo" "$dir"
cd "$dir"
commit="$(git rev-parse HEAD)"
load_before="$(cut -d' ' -f1-3 /proc/loadavg)"

# A number as JSON (bc prints .5 for 0.5).
num() { printf '%.2f' "$1"; }

# step NAME CMD...: wall seconds and CPU seconds (user+sys of children).
declare -A wall cpu
step() {
  local name="$1"; shift
  local t0 c0 t1 c1
  t0=$(date +%s.%N)
  c0=$(awk '{print $14+$15+$16+$17}' /proc/$$/stat)
  "$@" > "/tmp/setup-$name.log" 2>&1
  t1=$(date +%s.%N)
  c1=$(awk '{print $14+$15+$16+$17}' /proc/$$/stat)
  wall[$name]=$(echo "$t1 - $t0" | bc)
  cpu[$name]=$(echo "($c1 - $c0) / $(getconf CLK_TCK)" | bc -l)
}

step build_gpuslice cargo build --release -p gpuslice
step build_shim cargo build --release -p gpuslice-shim
# install.sh's relink, as it runs it but not --quiet, to count what it compiles.
step relink cargo rustc --release -p gpuslice --bin gpuslice -- -C target-feature=+crt-static
step install scripts/install.sh "$dir/installed"
relinked=$(grep -c '^ *Compiling' /tmp/setup-relink.log || true)
relinked_names=$(grep '^ *Compiling' /tmp/setup-relink.log | awk '{print $2}' | paste -sd, - || true)
shim_rebuilt=$(grep -c '^ *Compiling' /tmp/setup-build_shim.log || true)
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"

out="$repo/bench/results/setup-time-$(hostname -s)-$(date -u +%Y%m%dT%H%MZ).json"
total_wall=$(echo "${wall[build_gpuslice]} + ${wall[build_shim]} + ${wall[relink]} + ${wall[install]}" | bc)
total_cpu=$(echo "${cpu[build_gpuslice]} + ${cpu[build_shim]} + ${cpu[relink]} + ${cpu[install]}" | bc -l)
cat > "$out" <<EOF
{
  "what": "README.md set-up build from a fresh clone with an empty target directory",
  "command": "cargo build --release -p gpuslice && cargo build --release -p gpuslice-shim && scripts/install.sh",
  "script": "scripts/setup_time.sh",
  "commit": "$commit",
  "date_utc": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "cores": $(nproc),
  "rustc": "$(rustc --version)",
  "load_average_before": "$load_before",
  "load_average_after": "$load_after",
  "seconds": {
    "build_gpuslice": {"wall": $(num ${wall[build_gpuslice]}), "cpu": $(num ${cpu[build_gpuslice]})},
    "build_shim": {"wall": $(num ${wall[build_shim]}), "cpu": $(num ${cpu[build_shim]})},
    "static_relink": {"wall": $(num ${wall[relink]}), "cpu": $(num ${cpu[relink]})},
    "install": {"wall": $(num ${wall[install]}), "cpu": $(num ${cpu[install]})},
    "total": {"wall": $(num $total_wall), "cpu": $(num $total_cpu)}
  },
  "crates_compiled_by_the_shim_build": $shim_rebuilt,
  "crates_compiled_by_the_static_relink": $relinked,
  "static_relink_compiled": "$relinked_names"
}
EOF
echo "$out"
cat "$out"
