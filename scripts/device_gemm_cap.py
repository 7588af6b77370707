#!/usr/bin/env python3
"""On the GPU machine: a GEMM loop under a memory cap alone, against bare.

    python3 scripts/device_gemm_cap.py OUT.json   # as root, repo root, after device-build.sh

Two long-lived PyTorch workers, one bare and one in `gpuslice run --gpus 0 --memory 20GiB`,
take turns (never both at once) running 8192^2 bf16 GEMMs for ROUNDS windows of WINDOW_S
seconds each, the order alternating round by round, after a warm-up of each. Recorded: every
window's TFLOP/s, the medians, and the ratio gpuslice / bare (want >= 0.99). Separate processes
started anew for each sample (scripts/device_shim.py's perf part) mostly measure the card's
clock ramp; here both workers are warm and the same seconds of the run are split between them.
About 60 s.
"""
import json, os, statistics, subprocess, sys, time

OUT = sys.argv[1] if len(sys.argv) > 1 else "/tmp/gemm-cap.json"
PY = os.environ.get("TORCH_PY", "/opt/torch/.venv/bin/python3")
CARRY = os.path.abspath(os.environ.get("GPUSLICE_CARRY", ".device-carry"))
GPUSLICE = os.path.join(CARRY, "gpuslice")
ROUNDS, WINDOW_S = int(os.environ.get("ROUNDS", "12")), float(os.environ.get("WINDOW_S", "1.5"))

WORKER = r'''
import json, sys, time, torch
n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
print("READY", flush=True)
for line in sys.stdin:
    secs = float(line)
    torch.cuda.synchronize()
    k, t = 0, time.perf_counter()
    while time.perf_counter() - t < secs:
        for _ in range(8):
            torch.matmul(a, b, out=c)
        k += 8
        torch.cuda.synchronize()
    dt = time.perf_counter() - t
    print(json.dumps({"tflops": 2 * n ** 3 * k / dt / 1e12}), flush=True)
'''


def start(cmd):
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line.startswith("READY"):
        raise RuntimeError(f"{cmd[:6]}: {line!r} {p.stderr.read()[-1000:]}")
    return p


def window(p, secs):
    p.stdin.write(f"{secs}\n")
    p.stdin.flush()
    return json.loads(p.stdout.readline())["tflops"]


def main():
    R = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
         "issue": 16, "what": "8192^2 bf16 GEMM loop, bare vs gpuslice run --memory 20GiB, alternating windows",
         "rounds": ROUNDS, "window_s": WINDOW_S}
    R["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,name", "--format=csv,noheader"],
                                 capture_output=True, text=True).stdout.strip()
    bare_cmd = [PY, "-c", WORKER]
    cap_cmd = [GPUSLICE, "run", "--gpus", "0", "--memory", "20GiB", "--", PY, "-c", WORKER]
    R["commands"] = {"bare": bare_cmd[:2] + ["<WORKER in scripts/device_gemm_cap.py>"],
                     "gpuslice": cap_cmd[:-1] + ["<WORKER in scripts/device_gemm_cap.py>"]}
    workers = {"bare": start(bare_cmd), "gpuslice": start(cap_cmd)}
    try:
        for w in workers.values():
            window(w, 3.0)  # warm: clocks, cuBLAS heuristics
        samples = {"bare": [], "gpuslice": []}
        for r in range(ROUNDS):
            order = ("bare", "gpuslice") if r % 2 == 0 else ("gpuslice", "bare")
            for name in order:
                samples[name].append(window(workers[name], WINDOW_S))
    finally:
        for w in workers.values():
            w.stdin.close()
            w.wait(30)
    med = {k: statistics.median(v) for k, v in samples.items()}
    R["samples_tflops"] = samples
    R["median_tflops"] = med
    R["ratio"] = med["gpuslice"] / med["bare"]
    R["want"] = "ratio >= 0.99"
    R["pass"] = R["ratio"] >= 0.99
    with open(OUT, "w") as f:
        json.dump(R, f, indent=1)
    print(json.dumps({k: R[k] for k in ("median_tflops", "ratio", "pass")}))


if __name__ == "__main__":
    main()
