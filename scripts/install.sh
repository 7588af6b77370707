#!/usr/bin/env bash
# Installs what `cargo build --release -p gpuslice` and
# `cargo build --release -p gpuslice-shim` built (two commands: README.md says why)
# into one directory (default /usr/local/bin): `gpuslice`, `gpuslice-full`
# (which `gpuslice` execs for the commands it does not carry) and the shim,
# renamed from cargo's libgpuslice_shim.so to its installed name
# libgpuslice.so (the name `gpuslice run --memory`, the CDI specs and the
# DaemonSet use). Usage: scripts/install.sh [DIR]  (run as root for /usr/local/bin)
#
# The `gpuslice` launcher is relinked statically first (`+crt-static`: no
# loader work on each job's start; see docs/architecture.md). Without
# cargo on PATH (e.g. under sudo) the dynamically linked one from the
# build is installed: slower to start, the same behaviour.
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-/usr/local/bin}"
if command -v cargo >/dev/null; then
  cargo rustc --release --quiet -p gpuslice --bin gpuslice -- -C target-feature=+crt-static
else
  echo "scripts/install.sh: cargo not on PATH: installing the dynamically linked gpuslice launcher" >&2
fi
for f in gpuslice gpuslice-full libgpuslice_shim.so; do
  [ -f "target/release/$f" ] || {
    echo "scripts/install.sh: target/release/$f is missing: run cargo build --release -p gpuslice and cargo build --release -p gpuslice-shim first" >&2
    exit 1
  }
done
install -d "$dest"
install -m 0755 target/release/gpuslice target/release/gpuslice-full "$dest/"
install -m 0755 target/release/libgpuslice_shim.so "$dest/libgpuslice.so"
echo "installed gpuslice, gpuslice-full and libgpuslice.so into $dest"
