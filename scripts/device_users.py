#!/usr/bin/env python3
"""Users and device-number hiding on the GPU machine:

1. `gpuslice run --gpus 0 --user nobody`: PyTorch, JAX and CuPy each run a
   small computation on the GPU as uid 65534 (Uid/Gid/Groups/CapEff of the
   slice's process recorded);
2. `--gpus none` (as root and as nobody): the same frameworks see no GPU;
3. a copy of /dev/nvidia0 made as /dev/gpualias (mknod, same 195:0): in a
   `--gpus none` slice it does not exist and opening it fails; with
   `--gpus 0` it is there. The node is removed afterwards, whatever happens.

Writes WORK/users.json with the exact commands, date and driver version.

    python3 scripts/device_users.py WORK
"""
import datetime, json, os, stat, subprocess, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from device_common import FRAMEWORKS, last_json  # noqa: E402

CARRY = os.path.join(os.getcwd(), ".device-carry")
GS = os.path.join(CARRY, "gpuslice")
ALIAS = "/dev/gpualias"
PYTHONS = [p for p in (os.environ.get("TORCH_PY"), "/opt/torch/.venv/bin/python3", "python3") if p]

STATUS = "grep -E '^(Uid|Gid|Groups|CapEff|NoNewPrivs):' /proc/self/status"


def sh(args, timeout=120, env=None):
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd="/tmp", env=env)
        return {"args": args, "rc": p.returncode, "stdout": p.stdout[-3000:], "stderr": p.stderr[-3000:]}
    except Exception as e:  # timeout, missing binary
        return {"args": args, "rc": None, "error": repr(e)}


def python_for(framework):
    for py in PYTHONS:
        if sh([py, "-c", "import " + framework], timeout=60).get("rc") == 0:
            return py
    return None


def main():
    work = sys.argv[1]
    os.makedirs(work, exist_ok=True)
    rec = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "driver": open("/proc/driver/nvidia/version").read().splitlines()[0],
        "gpuslice": sh([GS, "--version"])["stdout"].strip(),
    }
    # Caches a nobody process can write (its HOME is /nonexistent).
    env = dict(os.environ, CUPY_CACHE_DIR="/tmp/gpuslice-users-cupy", XDG_CACHE_HOME="/tmp/gpuslice-users-cache")
    rec["status_as_nobody"] = sh([GS, "run", "--gpus", "0", "--user", "nobody", "--", "sh", "-c", STATUS], env=env)
    rec["frameworks"] = {}
    for fw, code in FRAMEWORKS.items():
        py = python_for(fw)
        if py is None:
            rec["frameworks"][fw] = {"error": "no python here imports " + fw}
            continue
        runs = {
            "gpus0_nobody": [GS, "run", "--gpus", "0", "--user", "nobody", "--", py, "-c", code],
            "none_nobody": [GS, "run", "--gpus", "none", "--user", "nobody", "--", py, "-c", code],
            "none_root": [GS, "run", "--gpus", "none", "--", py, "-c", code],
        }
        rec["frameworks"][fw] = {"python": py}
        for k, args in runs.items():
            r = sh(args, env=env)
            r["seen"] = last_json(r)
            rec["frameworks"][fw][k] = r

    # The alias: a second name for the GPU node, made and removed here.
    try:
        st = os.stat("/dev/nvidia0")
        os.mknod(ALIAS, 0o666 | stat.S_IFCHR, st.st_rdev)
        rec["alias"] = {"path": ALIAS, "rdev": [os.major(st.st_rdev), os.minor(st.st_rdev)]}
        # Opened only if it is the character device (`<>` would create a plain
        # file where the alias is hidden).
        probe = f"ls -l {ALIAS} 2>&1; [ -c {ALIAS} ] && (exec 3<>{ALIAS}) 2>&1 && echo opened"
        rec["alias"]["none_root"] = sh([GS, "run", "--gpus", "none", "--", "sh", "-c", probe])
        rec["alias"]["none_nobody"] = sh([GS, "run", "--gpus", "none", "--user", "nobody", "--", "sh", "-c", probe])
        rec["alias"]["gpus0_root"] = sh([GS, "run", "--gpus", "0", "--", "sh", "-c", probe])
        py = python_for("torch")
        if py:
            rec["alias"]["none_torch"] = sh([GS, "run", "--gpus", "none", "--", py, "-c", FRAMEWORKS["torch"]], env=env)
            rec["alias"]["none_torch"]["seen"] = last_json(rec["alias"]["none_torch"])
    except Exception as e:
        rec["alias_error"] = repr(e)
    finally:
        if os.path.lexists(ALIAS):
            os.unlink(ALIAS)
        rec["alias_removed"] = not os.path.lexists(ALIAS)

    fws = rec["frameworks"]
    ok_gpu = all(((fws[f].get("gpus0_nobody") or {}).get("seen") or {}).get("devices", 0) >= 1 for f in fws)
    ok_none = all(((fws[f].get(k) or {}).get("seen") or {"devices": 1}).get("devices") == 0
                  for f in fws for k in ("none_nobody", "none_root"))
    a = rec.get("alias", {})
    ok_alias = (
        "No such file" in a.get("none_root", {}).get("stdout", "")
        and "No such file" in a.get("none_nobody", {}).get("stdout", "")
        and "opened" not in a.get("none_root", {}).get("stdout", "")
        and "opened" in a.get("gpus0_root", {}).get("stdout", "")
    )
    rec["ok"] = {"frameworks_as_nobody": ok_gpu, "none_sees_no_gpu": ok_none, "alias_hidden": ok_alias}
    json.dump(rec, open(os.path.join(work, "users.json"), "w"), indent=1)
    print(json.dumps(rec["ok"]))


if __name__ == "__main__":
    main()
