#!/usr/bin/env bash
# Build what scripts/device-verify.sh runs on the GPU machine, into the
# git-ignored .device-carry/ (named in the device tool's `carry`).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p gpuslice
cargo build --release -p gpuslice-shim
rm -rf .device-carry && mkdir -p .device-carry
scripts/install.sh .device-carry
cp target/release/gpuslice-cuda-probe .device-carry/
# The benchmarks and self-tests (`gpuslice bench`, `device-plugin-selftest`
# exec it beside gpuslice-full). Built after the install's relink, alone:
# its test doubles' features stay out of the product's dependency build.
cargo build --release -p gpuslice-bench
cp target/release/gpuslice-bench .device-carry/
# The C client of scripts/device_enforcer.py (the GPU machine may have no
# C compiler).
cc -O1 -o .device-carry/driver_client crates/gpuslice/tests/escapes/driver_client.c
# The GPU machine has no package registry: bring Debian's bubblewrap for
# the launch benchmark (it links only glibc, libcap and libselinux).
if command -v bwrap >/dev/null; then cp "$(command -v bwrap)" .device-carry/; fi
strip .device-carry/gpuslice .device-carry/gpuslice-full .device-carry/gpuslice-bench .device-carry/gpuslice-cuda-probe .device-carry/driver_client 2>/dev/null || true
du -sh .device-carry
