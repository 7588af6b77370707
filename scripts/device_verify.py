#!/usr/bin/env python3
"""Verify `gpuslice run` isolation on a real GPU machine (run as root).

Run from the repository root after scripts/device-build.sh, with the
binaries in .device-carry/; writes one JSON document to $OUT (or argv[1]).
Every check records the exact command, its exit code and output, so the
result file is its own evidence.
"""
import datetime
import json
import os
import subprocess
import sys
import time

CARRY = os.path.abspath(".device-carry")
GS = os.path.join(CARRY, "gpuslice")
PROBE = os.path.join(CARRY, "gpuslice-cuda-probe")
OUT = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "/tmp")


def sh(cmd, timeout=30):
    t = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        return {"argv": cmd, "rc": None, "timeout_s": timeout, "stdout": str(e.stdout)[-2000:], "stderr": str(e.stderr)[-2000:]}
    except OSError as e:
        return {"argv": cmd, "rc": None, "stdout": "", "stderr": str(e)}
    return {"argv": cmd, "rc": p.returncode, "wall_ms": (time.time() - t) * 1e3, "stdout": p.stdout[-4000:], "stderr": p.stderr[-2000:]}


def probe_json(rec):
    try:
        return json.loads(rec["stdout"].strip().splitlines()[-1])
    except Exception:
        return None


def run(sel, iso=None, extra=(), cmd=()):
    argv = [GS, "run", "--gpus", sel]
    if iso:
        argv += ["--isolation", iso]
    return sh(argv + list(extra) + ["--"] + list(cmd))


class SavingDict(dict):
    """The checks: written to disk each time one is recorded."""
    on_set = None

    def __setitem__(self, k, v):
        super().__setitem__(k, v)
        if self.on_set:
            self.on_set()


def main():
    res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "checks": SavingDict()}
    smi = sh(["nvidia-smi", "--query-gpu=name,uuid,pci.bus_id,driver_version,memory.total,persistence_mode", "--format=csv,noheader"])
    res["nvidia_smi"] = smi["stdout"].strip().splitlines()
    res["gpu_count"] = len(res["nvidia_smi"])
    head = sh(["nvidia-smi"])["stdout"]
    res["cuda_version"] = next((l.split("CUDA Version:")[1].split()[0] for l in head.splitlines() if "CUDA Version:" in l), None)
    res["kernel"] = os.uname().release
    res["cgroup"] = open("/proc/self/cgroup").read().strip()
    c = res["checks"]
    path = os.path.join(OUT, "isolation.json")

    def save():
        # After every check, so a hang or a kill loses nothing already measured.
        with open(path, "w") as f:
            json.dump(res, f, indent=1)

    c.on_set = save

    c["list"] = sh([GS, "list", "--json"])
    c["list_text"] = sh([GS, "list"])

    # The finding, reproduced: hiding the node (namespace) is not enough as
    # root; full isolation is. The probe ignores CUDA_VISIBLE_DEVICES, as a
    # process may.
    for iso in ["full", "namespace", "cgroup", "env"]:
        c[f"none_{iso}"] = run("none", iso, cmd=[PROBE, "--ignore-visible-devices"])
        c[f"none_{iso}"]["probe"] = probe_json(c[f"none_{iso}"])
    c["none_full_strict"] = run("none", "full", ["--strict"], [PROBE, "--ignore-visible-devices"])
    c["none_full_strict"]["probe"] = probe_json(c["none_full_strict"])
    c["gpu0_full"] = run("0", cmd=[PROBE])
    c["gpu0_full"]["probe"] = probe_json(c["gpu0_full"])
    c["gpu0_v2_explicit"] = run("0", "full", ["--cgroup", "v2"], [PROBE])
    c["gpu0_v2_explicit"]["probe"] = probe_json(c["gpu0_v2_explicit"])
    c["smi_gpu0"] = run("0", cmd=["nvidia-smi", "-L"])
    c["smi_none"] = run("none", cmd=["nvidia-smi", "-L"])
    c["host_dev_after"] = sh(["ls", "-l", "/dev/"] + [f for f in os.listdir("/dev") if f.startswith("nvidia")])

    # A root child re-creating the node itself: the cgroup denies the open.
    c["none_mknod_open"] = run("none", cmd=["sh", "-c", "mknod /tmp/gs-nv c 195 0; exec 3<>/tmp/gs-nv; echo opened"])
    c["none_mknod_dev_probe"] = run("none", cmd=["sh", "-c", f"mknod /dev/nvidia0 c 195 0; ls -l /dev/nvidia0; {PROBE} --ignore-visible-devices"])
    # Under --strict: no mknod, no remount of /dev or /proc, no setuid way back.
    strict_script = "; ".join([
        "mknod /tmp/gs-nv2 c 195 0 && echo MKNOD_OK || echo MKNOD_DENIED",
        "umount /dev && echo UMOUNT_DEV_OK || echo UMOUNT_DEV_DENIED",
        "umount /proc/driver/nvidia/params && echo UMOUNT_PARAMS_OK || echo UMOUNT_PARAMS_DENIED",
        "mount -t proc proc /proc && echo MOUNT_PROC_OK || echo MOUNT_PROC_DENIED",
        "mount -t devtmpfs none /mnt && echo MOUNT_DEVTMPFS_OK || echo MOUNT_DEVTMPFS_DENIED",
        "(command -v nvidia-modprobe && nvidia-modprobe -c 0 -u; echo modprobe_rc=$?)",
        "ls /dev | grep -c '^nvidia[0-9]' || true",
        "grep -E 'NoNewPrivs|CapEff|CapBnd' /proc/self/status",
        f"{PROBE} --ignore-visible-devices",
    ])
    c["strict_escape"] = run("none", "full", ["--strict"], ["sh", "-c", strict_script])

    bwrap = os.path.join(CARRY, "bwrap")
    env = dict(os.environ, PATH=CARRY + ":" + os.environ.get("PATH", ""))
    try:
        p = subprocess.run([GS, "bench", "launch", "--runs", "300", "--json"], capture_output=True, text=True, env=env, timeout=240, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        p = subprocess.CompletedProcess(e.cmd, None, str(e.stdout), str(e.stderr))
    c["bench_launch"] = {"argv": [GS, "bench", "launch", "--runs", "300", "--json"], "rc": p.returncode, "stderr": p.stderr[-2000:],
                         "bwrap": os.path.exists(bwrap)}
    try:
        c["bench_launch"]["result"] = json.loads(p.stdout)
    except Exception:
        c["bench_launch"]["stdout"] = p.stdout[-2000:]

    leftovers = sh(["sh", "-c", "ls -d /sys/fs/cgroup/gpuslice/* 2>/dev/null; grep -c gpuslice /proc/self/mountinfo || true"])
    c["leftovers"] = leftovers
    save()
    print(json.dumps({k: (v.get("rc"), (v.get("probe") or {}).get("count"), (v.get("probe") or {}).get("init_rc")) for k, v in c.items()}, indent=1))


if __name__ == "__main__":
    main()
