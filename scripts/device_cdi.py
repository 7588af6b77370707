#!/usr/bin/env python3
"""On the GPU machine: `gpuslice cdi generate` from the real
driver, every host path in the spec exists, `gpuslice cdi check`, and a
CUDA process run through `gpuslice run` with the device set of the spec's
device 0. No container runtime there: the spec's nodes are what `run`
exposes. Writes WORK/cdi.json (and the spec WORK/cdi.yaml, WORK/cdi-spec.json).

    python3 scripts/device_cdi.py WORK
"""
import json, os, subprocess, sys

CARRY = os.path.join(os.getcwd(), ".device-carry")
GS = os.path.join(CARRY, "gpuslice")
PROBE = os.path.join(CARRY, "gpuslice-cuda-probe")


def sh(args, timeout=20):
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
        return {"args": args, "rc": p.returncode, "stdout": p.stdout[-4000:], "stderr": p.stderr[-4000:]}
    except Exception as e:  # timeout, missing binary
        return {"args": args, "rc": None, "error": repr(e)}


def main():
    work = sys.argv[1]
    os.makedirs(work, exist_ok=True)
    rec = {"driver": open("/proc/driver/nvidia/version").read().splitlines()[0]}
    spec_yaml = os.path.join(work, "cdi.yaml")
    spec_json = os.path.join(work, "cdi-spec.json")
    rec["generate"] = sh([GS, "cdi", "generate", "--output", spec_yaml])
    rec["generate_json"] = sh([GS, "cdi", "generate", "--format", "json", "--output", spec_json])
    try:
        spec = json.load(open(spec_json))
    except Exception as e:
        rec["spec_error"] = repr(e)
        spec = {}
    edits = [spec.get("containerEdits", {})] + [d["containerEdits"] for d in spec.get("devices", [])]
    paths = set()
    for e in edits:
        paths.update(n.get("hostPath", n["path"]) for n in e.get("deviceNodes", []))
        paths.update(m["hostPath"] for m in e.get("mounts", []) if m.get("type") != "tmpfs")
        paths.update(h["path"] for h in e.get("hooks", []))
    rec["device_names"] = [d["name"] for d in spec.get("devices", [])]
    rec["host_paths"] = sorted(paths)
    rec["missing_host_paths"] = sorted(p for p in paths if not os.path.lexists(p))
    rec["mounts"] = [m["containerPath"] for m in spec.get("containerEdits", {}).get("mounts", [])]
    rec["check"] = sh([GS, "cdi", "check", "--spec", spec_yaml])
    dev0 = next((d for d in spec.get("devices", []) if d["name"] == "0"), None)
    rec["device0_nodes"] = [n["path"] for n in dev0["containerEdits"].get("deviceNodes", [])] if dev0 else None
    rec["run_probe"] = sh([GS, "run", "--gpus", "0", "--", PROBE], timeout=30)
    rec["run_probe_nodes"] = sh([GS, "run", "--gpus", "0", "--", "sh", "-c", "ls /dev | grep nvidia"])
    rec["ok"] = (
        rec["generate"]["rc"] == 0
        and not rec["missing_host_paths"]
        and rec["check"]["rc"] == 0
        and rec["run_probe"]["rc"] == 0
    )
    json.dump(rec, open(os.path.join(work, "cdi.json"), "w"), indent=1)
    print(json.dumps({k: rec[k] for k in ("ok", "missing_host_paths", "device_names")})[:2000])


if __name__ == "__main__":
    main()
