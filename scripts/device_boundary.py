#!/usr/bin/env python3
"""On the real GPU host: the attacks of crates/gpuslice/tests/boundary.rs
against the real driver, the frameworks, and the launch benchmark (run as
root from the repo root after scripts/device-build.sh; writes
OUT/boundary.json and OUT/launch-boundary.json; ~150 s, bounded at 330 s
by scripts/device_all.sh).

Every attack runs with `--gpus none` (on a 1-GPU host every layer is then
active: private /dev without nvidia0, params overlay, BPF device filter,
PID and cgroup namespaces, read-only /sys, capabilities, seccomp) under the
default flags, `--strict`, `--strict --pid host`, and `--privileged` (where it should get
through, so a "held" is not an accident of the test). An attack got
through when its script printed ATTACK-OK. Then PyTorch, JAX and CuPy: no
GPU under `--gpus none` (default flags, root), a computation on the GPU
under `--gpus 0 --user nobody`. Then `gpuslice bench launch --gpus none
--runs 300`: bare /bin/true, the default launch (every layer), --privileged,
env, and bwrap --unshare-pid --unshare-cgroup --dev /dev, interleaved.

"pass" is true when: every attack held under the default flags, under
--strict and under --strict --pid host; the control attacks (PRIVILEGED_CONTROLS) got through under
--privileged; each framework saw 0 GPUs under --gpus none and >= 1 GPU with
a correct result under --gpus 0 as nobody; the default launch's median is
<= bwrap's and within +2.5 ms of bare /bin/true's. "criteria" says which
of these held.
"""
import datetime, json, os, subprocess, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from device_common import FRAMEWORKS, last_json  # noqa: E402

CARRY = os.path.abspath(".device-carry")
GS = os.path.join(CARRY, "gpuslice")
ATTACK = os.path.abspath("crates/gpuslice/tests/boundary/attack.py")
OUT = sys.argv[1] if len(sys.argv) > 1 else "/tmp"
MODES = {"default": [], "strict": ["--strict"], "strict-pid-host": ["--strict", "--pid", "host"],
         "privileged": ["--privileged"]}
PY = "/usr/bin/python3"
CUPY_CACHE = "/tmp/gpuslice-cupy-cache"
# Opens a file for writing and closes it without writing: ATTACK-OK if it opened.
OPEN_W = PY + " -c \"import os,sys; os.close(os.open(sys.argv[1], os.O_WRONLY)); print('ATTACK-OK')\" {} 2>/dev/null"
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
        # The descriptor itself is the breach (the device cgroup checks opens,
        # not ioctls on an fd opened outside): is the GPU node's fd here?
        "inherited-fd": f"{PY} -c 'import os,stat,sys; s=os.fstat(5); "
        "sys.exit(not (stat.S_ISCHR(s.st_mode) and os.major(s.st_rdev) == 195))' 2>/dev/null && echo ATTACK-OK",
        "write-sysfs": "echo 1 > /sys/bus/pci/rescan && echo ATTACK-OK",
        # Opened for writing only, never written (the host's
        # core_pattern is not to be touched even by a test expecting EROFS).
        "write-proc-sys": OPEN_W.format("/proc/sys/kernel/core_pattern"),
        # What every other slice loads.
        "write-shim": OPEN_W.format(os.path.join(CARRY, "libgpuslice.so")),
        "write-ld-so-cache": OPEN_W.format("/etc/ld.so.cache"),
        "write-libcuda": OPEN_W.format("$(readlink -f $(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}'))"),
    }


# Attacks that must get through under --privileged, so that "held" above
# is the boundary's doing (the H200 repro is umount-dev).
PRIVILEGED_CONTROLS = ["cgroup-move-self", "umount-dev", "mknod", "unshare", "inherited-fd"]

# (flags, what must be seen): no GPU as root; the GPU as a non-root user.
FRAMEWORK_RUNS = {"none": (["--gpus", "none"], 0), "0-as-nobody": (["--gpus", "0", "--user", "nobody"], 1)}


def launch_bench(res):
    env = dict(os.environ, PATH=CARRY + ":" + os.environ.get("PATH", ""))
    rec = sh([os.path.join(CARRY, "gpuslice-full"), "bench", "launch", "--runs", "300", "--gpus", "none",
              "--json", "--out", os.path.join(OUT, "launch-boundary.json")], timeout=150, env=env)
    res["launch"] = {"argv": rec["argv"], "rc": rec["rc"], "stderr": rec.get("stderr", "")}
    try:  # the whole result from --out (sh() keeps only stdout's tail)
        with open(os.path.join(OUT, "launch-boundary.json")) as f:
            j = json.load(f) if rec["rc"] == 0 else {}
    except (OSError, ValueError):
        j = {}
    med = {v["name"]: v["ms"]["median"] for v in j.get("variants", [])}
    res["launch"]["median_ms"] = med
    bare, default, bwrap = med.get("bare"), med.get("gpuslice default"), med.get("bwrap pid+cgroup+dev")
    res["launch"]["default_minus_bare_ms"] = None if None in (bare, default) else round(default - bare, 3)
    return {
        "launch_default_le_bwrap": None not in (default, bwrap) and default <= bwrap,
        "launch_default_within_2.5ms_of_bare": None not in (default, bare) and default - bare <= 2.5,
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
        # One cache for root and nobody (sticky and world-writable, like /tmp).
        os.makedirs(CUPY_CACHE, exist_ok=True)
        os.chmod(CUPY_CACHE, 0o1777)
        for fw, code in FRAMEWORKS.items():
            py = interpreter(fw)
            res["frameworks"][fw] = {"python": py}
            for run, (flags, want) in FRAMEWORK_RUNS.items():
                if py is None:
                    continue
                # nobody's HOME is /nonexistent: CuPy's kernel cache goes to /tmp.
                rec = sh([GS, "run"] + flags + ["--", py, "-c", code], timeout=120, cwd="/tmp",
                         env=dict(os.environ, CUPY_CACHE_DIR=CUPY_CACHE))
                seen = last_json(rec) or {}
                rec["seen"] = seen
                rec["ok"] = rec["rc"] == 0 and (
                    seen.get("devices") == 0 if want == 0 else
                    (seen.get("devices") or 0) >= 1 and seen.get("result") == 2048.0)
                res["frameworks"][fw][run] = rec
                save()
    finally:
        victim.kill(); nobody.kill(); victim.wait(); nobody.wait()
    res["summary"] = {m: sorted(n for n, r in res["attacks"].items() if r[m]["result"] == "broken") for m in MODES}
    crit = {
        "every_attack_held_default": bool(res["attacks"]) and not res["summary"]["default"],
        "every_attack_held_strict": bool(res["attacks"]) and not res["summary"]["strict"],
        "every_attack_held_strict_pid_host": bool(res["attacks"]) and not res["summary"]["strict-pid-host"],
        "privileged_controls_got_through": all(c in res["summary"]["privileged"] for c in PRIVILEGED_CONTROLS),
        "frameworks": all(res["frameworks"].get(fw, {}).get(run, {}).get("ok") for fw in FRAMEWORKS
                          for run in FRAMEWORK_RUNS),
    }
    crit.update(launch_bench(res))
    res["criteria"] = crit
    res["pass"] = all(crit.values())
    save()
    print(json.dumps({"summary": res["summary"], "criteria": crit, "pass": res["pass"]}, indent=1))

if __name__ == "__main__":
    main()
