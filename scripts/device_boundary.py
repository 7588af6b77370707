#!/usr/bin/env python3
"""Issue 15 on the real GPU host: the attacks of crates/gpuslice/tests/boundary.rs
against the real driver (run as root from the repo root after
scripts/device-build.sh; writes OUT/boundary.json).

Every attack runs with `--gpus none` (on a 1-GPU host every layer is then
active: private /dev without nvidia0, params overlay, BPF device filter,
PID and cgroup namespaces, read-only /sys, capabilities, seccomp) under the
default flags, `--strict`, and `--privileged` (where it should get
through, so a "held" is not an accident of the test). An attack got
through when its script printed ATTACK-OK. Then PyTorch, JAX and CuPy: no
GPU under `--gpus none`, working under `--gpus 0` (default flags, root).
"""
import datetime, json, os, subprocess, sys, time

CARRY = os.path.abspath(".device-carry")
GS = os.path.join(CARRY, "gpuslice")
ATTACK = os.path.abspath("crates/gpuslice/tests/boundary/attack.py")
OUT = sys.argv[1] if len(sys.argv) > 1 else "/tmp"
MODES = {"default": [], "strict": ["--strict"], "privileged": ["--privileged"]}
PY = "/usr/bin/python3"
# What the issue's own repro needs first: out of the slice cgroup (a
# no-op where that is refused).
ESCAPE = "echo $$ > /sys/fs/cgroup/cgroup.procs 2>/dev/null; "


def sh(argv, timeout=60, **kw):
    t = time.time()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, **kw)
    except subprocess.TimeoutExpired as e:
        return {"argv": argv, "rc": None, "timeout_s": timeout, "stdout": str(e.stdout)[-2000:], "stderr": str(e.stderr)[-2000:]}
    return {"argv": argv, "rc": p.returncode, "wall_ms": round((time.time() - t) * 1e3, 1),
            "stdout": p.stdout[-3000:], "stderr": p.stderr[-2000:]}


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def in_slice(mode, script, sel="none", **kw):
    return sh([GS, "run", "--gpus", sel] + MODES[mode] + ["--", "sh", "-c", script], **kw)


def attacks(victim_pid, nobody_pid, host_pid):
    a = f"{PY} {ATTACK}"
    return {
        "cgroup-move-self": "echo $$ > /sys/fs/cgroup/cgroup.procs && echo ATTACK-OK",
        "cgroup-move-other-slice": f"echo {victim_pid} > /sys/fs/cgroup/cgroup.procs && echo ATTACK-OK",
        "ptrace-other-slice": f"[ $({a} ptrace {victim_pid}) = ok ] && echo ATTACK-OK",
        "process_vm_readv-other-slice": f"[ $({a} vmread {victim_pid}) = ok ] && echo ATTACK-OK",
        "ptrace-launcher-or-init": f"[ $({a} ptrace $PPID) = ok ] && echo ATTACK-OK",
        "proc-pid-root-host-process": ESCAPE + f"exec 3<>/proc/{host_pid}/root/dev/nvidia0 && echo ATTACK-OK",
        "setuid-then-proc-pid-root": ESCAPE + "setpriv --reuid=65534 --regid=65534 --clear-groups -- "
            f"sh -c 'exec 3<>/proc/{nobody_pid}/root/dev/nvidia0 && echo ATTACK-OK'",
        "bpf-detach": f"[ $({a} bpf-detach /sys/fs/cgroup$(sed -n 's/^0:://p' /proc/self/cgroup)) = ok ] "
            "&& mknod /tmp/gs-n0.$$ c 195 0 && exec 3<>/tmp/gs-n0.$$ && echo ATTACK-OK; rm -f /tmp/gs-n0.$$",
        "umount-dev": ESCAPE + "umount -l /dev && exec 3<>/dev/nvidia0 && echo ATTACK-OK",
        "umount-params": "umount /proc/driver/nvidia/params && grep -q 'ModifyDeviceFiles: 1' "
            "/proc/driver/nvidia/params && echo ATTACK-OK",
        "new-devtmpfs": "d=$(mktemp -d); mount -t devtmpfs none $d && [ -c $d/nvidia0 ] && echo ATTACK-OK; umount $d; rmdir $d",
        "mknod": "mknod /tmp/gs-m.$$ c 1 3 && echo ATTACK-OK; rm -f /tmp/gs-m.$$",
        "unshare": "unshare -m true && echo ATTACK-OK",
        "setns": "nsenter -t $PPID -m true && echo ATTACK-OK",
        "inherited-fd": "[ -e /proc/self/fd/5 ] && exec 3<>/proc/self/fd/5 && echo ATTACK-OK",
        "write-sysfs": "echo 1 > /sys/bus/pci/rescan && echo ATTACK-OK",
        "write-proc-sys": "cat /proc/sys/kernel/core_pattern > /proc/sys/kernel/core_pattern && echo ATTACK-OK",
    }


FRAMEWORKS = {
    "torch": "import torch; print(torch.cuda.device_count()); torch.cuda.device_count() and print(float(torch.ones(4).cuda().sum()))",
    "jax": "import jax; g=[d for d in jax.devices() if d.platform=='gpu']; print(len(g)); g and print(float(jax.numpy.ones(4).sum()))",
    "cupy": "import cupy; n=cupy.cuda.runtime.getDeviceCount(); print(n); print(float(cupy.ones(4).sum()))",
}


def interpreter(module):
    for py in [os.environ.get(module.upper() + "_PY"), os.environ.get("TORCH_PY"), "/opt/torch/.venv/bin/python3", "python3"]:
        if py and sh([py, "-c", f"import {module}"], timeout=60)["rc"] == 0:
            return py
    return None


def main():
    res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "argv": sys.argv,
           "driver": sh(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])["stdout"].strip(),
           "kernel": os.uname().release, "attacks": {}, "frameworks": {}}
    path = os.path.join(OUT, "boundary.json")

    def save():
        with open(path, "w") as f:
            json.dump(res, f, indent=1)

    victim = subprocess.Popen([GS, "run", "--gpus", "none", "--", "sleep", "300"], stderr=subprocess.DEVNULL)
    nobody = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sleep", "300"])
    time.sleep(1.0)
    victim_pid = next((int(p) for p in os.listdir("/proc") if p.isdigit()
                       and read(f"/proc/{p}/comm").strip() == "sleep"
                       and "gpuslice" in read(f"/proc/{p}/cgroup")), None)
    res["victim_pid"] = victim_pid
    gpu_fd = os.open("/dev/nvidia0", os.O_RDWR)
    os.dup2(gpu_fd, 5, inheritable=True)
    try:
        for name, script in attacks(victim_pid, nobody.pid, os.getpid()).items():
            res["attacks"][name] = {}
            for mode in MODES:
                rec = in_slice(mode, script, pass_fds=(5,), timeout=30)
                rec["result"] = "broken" if "ATTACK-OK" in rec["stdout"] else "held"
                res["attacks"][name][mode] = rec
            save()
        for fw, code in FRAMEWORKS.items():
            py = interpreter(fw)
            res["frameworks"][fw] = {"python": py}
            if py is None:
                continue
            for sel in ["none", "0"]:
                res["frameworks"][fw][sel] = sh([GS, "run", "--gpus", sel, "--", py, "-c", code], timeout=120)
                save()
    finally:
        victim.kill(); nobody.kill(); victim.wait(); nobody.wait()
    res["summary"] = {m: sorted(n for n, r in res["attacks"].items() if r[m]["result"] == "broken") for m in MODES}
    save()
    print(json.dumps(res["summary"], indent=1))


if __name__ == "__main__":
    main()
