#!/usr/bin/env bash
# The test command of README.md: installs what the tests need, then runs
# formatting, lint and every test. Needs root (the isolation tests mknod,
# mount and create cgroups on the real kernel) and a Debian-like system.
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkgs=()
# The build: libseccomp, with which crates/gpuslice-isolate/build.rs
# generates the seccomp filter.
dpkg -s libseccomp-dev >/dev/null 2>&1 || need_pkgs+=(libseccomp-dev)
command -v bwrap >/dev/null || need_pkgs+=(bubblewrap)
command -v mknod >/dev/null || need_pkgs+=(coreutils)
command -v unshare >/dev/null || need_pkgs+=(util-linux)
# The exporter test: a real Prometheus and promtool.
command -v prometheus >/dev/null || need_pkgs+=(prometheus)
# The CDI spec consumed by a real runtime (podman with runc), on an
# image made from busybox-static with podman import.
command -v podman >/dev/null || need_pkgs+=(podman)
command -v runc >/dev/null || need_pkgs+=(runc)
# A dynamically linked busybox would not run in the imported image.
dpkg -s busybox-static >/dev/null 2>&1 || need_pkgs+=(busybox-static)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}"
fi

# deploy/dra and the published ResourceSlices are validated
# against the upstream Kubernetes 1.36 schemas (kubernetes-validate ships
# them), in a venv of its own under target/.
if [ -z "${KUBERNETES_VALIDATE:-}" ] && ! command -v kubernetes-validate >/dev/null; then
  if [ ! -x target/kubernetes-validate/bin/kubernetes-validate ]; then
    python3 -m venv target/kubernetes-validate
    target/kubernetes-validate/bin/pip install -q 'kubernetes-validate>=1.36'
  fi
  export KUBERNETES_VALIDATE="$PWD/target/kubernetes-validate/bin/kubernetes-validate"
fi

# The Helm chart is rendered and linted by Helm itself, through
# helm-sdkpy (its wheel carries Helm's Go library). It declares Python >=
# 3.12 but runs on 3.11 (Debian 12): installed with --ignore-requires-python,
# pinned, in a venv of its own under target/.
helm_sdkpy_version=0.1.32
if [ -z "${HELM_SDKPY_PYTHON:-}" ]; then
  if ! target/helm-sdkpy/bin/python -c "import helm_sdkpy, importlib.metadata as m; assert m.version('helm-sdkpy') == '$helm_sdkpy_version'" 2>/dev/null; then
    rm -rf target/helm-sdkpy
    python3 -m venv target/helm-sdkpy
    target/helm-sdkpy/bin/pip install -q --ignore-requires-python "helm-sdkpy==$helm_sdkpy_version"
  fi
  export HELM_SDKPY_PYTHON="$PWD/target/helm-sdkpy/bin/python"
fi

# The DRA driver's sockets are dialled by gRPC C-core (Python's grpcio) with
# its default :authority, as a kubelet-side client would, in a venv of its
# own under target/.
if [ -z "${GPUSLICE_GRPCIO_PYTHON:-}" ]; then
  if ! target/grpcio/bin/python -c "import grpc" 2>/dev/null; then
    rm -rf target/grpcio
    python3 -m venv target/grpcio
    target/grpcio/bin/pip install -q 'grpcio>=1.60'
  fi
  export GPUSLICE_GRPCIO_PYTHON="$PWD/target/grpcio/bin/python"
fi

if [ "$(id -u)" != 0 ]; then
  echo "scripts/test.sh: the isolation tests need root (mknod, mount namespaces, cgroups); run it as root" >&2
  exit 1
fi

# The tests act as root. Under `sudo scripts/test.sh` sudo's variables
# would make every `gpuslice run` a policy-bound sudo caller;
# the tests that mean one set them themselves.
unset SUDO_UID SUDO_GID SUDO_USER SUDO_COMMAND

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace
# The fake driver is a cdylib the tests load at run time: build it first.
cargo build --workspace --all-targets
# The launcher linked statically, as scripts/install.sh installs it, beside
# its gpuslice-full, for tests/static_launcher.rs; then the dynamic build
# back in target/debug for the other tests.
cargo rustc --quiet -p gpuslice --bin gpuslice -- -C target-feature=+crt-static
rm -rf target/static-launcher && mkdir -p target/static-launcher
cp target/debug/gpuslice target/debug/gpuslice-full target/static-launcher/
cargo build --quiet -p gpuslice --bins
export GPUSLICE_STATIC_LAUNCHER_DIR="$PWD/target/static-launcher"
# Every test that a host cannot run is counted and listed here (under
# CI=true there are none: such a test fails instead).
skip_log="$PWD/target/skipped-tests.txt"
rm -f "$skip_log"
export GPUSLICE_TEST_SKIP_LOG="$skip_log"
report_skips() {
  if [ -s "$skip_log" ]; then
    echo "scripts/test.sh: $(wc -l <"$skip_log") test(s) SKIPPED on this host, not passed:" >&2
    cat "$skip_log" >&2
  else
    echo "scripts/test.sh: no test skipped"
  fi
}
trap report_skips EXIT
cargo test --workspace --no-fail-fast -- --test-threads=2
