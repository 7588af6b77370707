#!/usr/bin/env python3
"""A torch.compile'd GPT-2-like training loop, bare vs under a gpuslice
memory cap alone, measured interleaved (a real training loop).

    python3 scripts/device_gpt2.py OUT.json [--rounds 6] [--steps 40] [--cap 20GiB] [--pair enforcer]

Two long-lived workers are started: one bare, one under
`.device-carry/gpuslice run --gpus 0 --memory CAP`. Each builds the same
model (defined inline: 12 layers, 768 wide, 12 heads, context 1024,
vocabulary 50304; no download), compiles it with torch.compile (Inductor,
Triton kernels), trains with fused AdamW in bf16 autocast on random
tokens, and then waits. The host tells them in turn to run a round of
STEPS steps, the order alternating per round (bare first, then gpuslice
first, ...), so neither compiles nor warms up inside a measured round, the
GPU runs one at a time and neither always follows the other. Writes the
steps/s of every round and the median of the per-round ratios gpuslice /
bare; pass = at least 6 rounds and median ratio >= 0.99. The capped worker
runs with GPUSLICE_LOG=1; its stderr goes to a file (a pipe nobody reads
would stall it), and the number of calls per interposed function it logs
at exit is parsed into `gpuslice_calls` (and per training step into
`gpuslice_calls_per_step`): the per-step hot path, if any.

With `--pair enforcer` (the cost of root's enforcer), both
workers run under `gpuslice run --gpus 0 --memory CAP`: one with root's
enforcer on (a policy file saying `root_enforcer = "on"`), one with it off
(`root_enforcer = "off"`), named `enforcer_on` / `enforcer_off` in the JSON
in place of `gpuslice` / `bare`; the ratio is on / off and pass = at least
6 rounds and median ratio >= 0.995 (at most 0.5 % slower). Each launcher's
CPU time (user + system, from /proc: the enforcer's ticks run there) is
recorded as `launcher_cpu_s`.
"""

import datetime
import json
import os
import statistics
import subprocess
import sys

ROOT = os.getcwd()
GPUSLICE = os.path.join(ROOT, ".device-carry", "gpuslice")

WORKER = r'''
import math, sys, time, json
import torch, torch.nn as nn, torch.nn.functional as F

class Block(nn.Module):
    def __init__(s, d, h):
        super().__init__()
        s.h = h
        s.ln1 = nn.LayerNorm(d); s.qkv = nn.Linear(d, 3 * d); s.proj = nn.Linear(d, d)
        s.ln2 = nn.LayerNorm(d); s.fc = nn.Linear(d, 4 * d); s.out = nn.Linear(4 * d, d)
    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.qkv(s.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, s.h, C // s.h).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + s.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + s.out(F.gelu(s.fc(s.ln2(x)), approximate="tanh"))

class GPT(nn.Module):
    def __init__(s, vocab=50304, ctx=1024, d=768, layers=12, heads=12):
        super().__init__()
        s.tok = nn.Embedding(vocab, d); s.pos = nn.Embedding(ctx, d)
        s.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        s.ln = nn.LayerNorm(d); s.head = nn.Linear(d, vocab, bias=False)
        s.head.weight = s.tok.weight
    def forward(s, idx, targets):
        T = idx.shape[1]
        x = s.tok(idx) + s.pos(torch.arange(T, device=idx.device))
        for b in s.blocks:
            x = b(x)
        logits = s.head(s.ln(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

torch.manual_seed(0)
torch.backends.cuda.matmul.allow_tf32 = True
B, T = 8, 1024
model = GPT().cuda()
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
step_fn = torch.compile(model)
x = torch.randint(0, 50304, (B, T), device="cuda")
y = torch.randint(0, 50304, (B, T), device="cuda")

def step():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = step_fn(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)

t0 = time.monotonic()
for _ in range(12):
    step()
torch.cuda.synchronize()
print(json.dumps({"ready": True, "warmup_s": time.monotonic() - t0,
                  "total_memory": torch.cuda.get_device_properties(0).total_memory,
                  "max_reserved": torch.cuda.max_memory_reserved()}), flush=True)
for line in sys.stdin:
    n = int(line)
    if n <= 0:
        break
    torch.cuda.synchronize()
    t = time.monotonic()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    print(json.dumps({"steps_per_s": n / (time.monotonic() - t)}), flush=True)
'''


def start(cmd, env, err):
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=err, text=True, env=env)


def tail(f, n=4000):
    f.flush()
    f.seek(0)
    return f.read()[-n:]


def read_json(p, err):
    line = p.stdout.readline()
    if not line:
        raise RuntimeError("worker ended: " + tail(err, 2000))
    return json.loads(line)


def call_counts(log):
    """The shim's exit line `pid N calls: Family=n ...` -> {family: n}, summed
    over the pids that logged one (the launcher's child is the worker)."""
    counts = {}
    for line in log.splitlines():
        if " calls: " not in line:
            continue
        for item in line.split(" calls: ", 1)[1].split():
            name, _, n = item.partition("=")
            if n.isdigit():
                counts[name] = counts.get(name, 0) + int(n)
    return counts


def policy_file(text):
    """A policy file root alone can have written (gpuslice trusts no other):
    root's 0700 directory, 0644 file."""
    import tempfile
    d = tempfile.mkdtemp(prefix="gpuslice-policy-")
    path = os.path.join(d, "policy.toml")
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o644)
    return path


def cpu_s(pid):
    """User + system CPU seconds of a live process, from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def main():
    args = sys.argv[1:]
    out = args[0]
    rounds = int(args[args.index("--rounds") + 1]) if "--rounds" in args else 6
    steps = int(args[args.index("--steps") + 1]) if "--steps" in args else 40
    cap = args[args.index("--cap") + 1] if "--cap" in args else "20GiB"
    pair = args[args.index("--pair") + 1] if "--pair" in args else "shim"
    env = dict(os.environ)
    # The capped worker logs, at exit, how often each interposed function
    # was called (the per-step hot path, if any): kept in the JSON.
    capped_env = dict(env, GPUSLICE_LOG="1")
    bare_cmd = [sys.executable, "-c", WORKER]
    capped_cmd = [GPUSLICE, "run", "--gpus", "0", "--memory", cap, "--", sys.executable, "-c", WORKER]
    names = ("bare", "gpuslice")
    if pair == "enforcer":
        # Both capped; the baseline is the enforcer off, by the root-only
        # policy switch; the other the same with it on.
        names = ("enforcer_off", "enforcer_on")
        env = dict(env, GPUSLICE_POLICY=policy_file('root_enforcer = "off"\n'))
        capped_env = dict(capped_env, GPUSLICE_POLICY=policy_file('root_enforcer = "on"\n'))
        bare_cmd = capped_cmd
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "command": " ".join(sys.argv),
        "bare_command": bare_cmd[:2] + ["<WORKER>"],
        "gpuslice_command": capped_cmd[:-1] + ["<WORKER>"],
        "driver": subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True).stdout.strip(),
        "rounds": rounds, "steps": steps, "cap": cap, "pair": pair,
        names[0]: [], names[1]: [],
    }
    if pair == "enforcer":
        result["gpuslice_command"] = capped_cmd[:-1] + ["<WORKER>"]
        result["bare_command"] = result["gpuslice_command"]
    base, other = names
    # Compile one after the other (the Inductor cache helps the second).
    import tempfile
    errs = {name: tempfile.TemporaryFile("w+", errors="replace") for name in names}
    bare = start(bare_cmd, env, errs[base])
    result[base + "_ready"] = read_json(bare, errs[base])
    capped = start(capped_cmd, capped_env, errs[other])
    result[other + "_ready"] = read_json(capped, errs[other])
    workers = [(base, bare), (other, capped)]
    for r in range(rounds):
        for name, p in (workers if r % 2 == 0 else workers[::-1]):
            p.stdin.write(f"{steps}\n")
            p.stdin.flush()
            result[name].append(read_json(p, errs[name])["steps_per_s"])
    result["launcher_cpu_s"] = {name: cpu_s(p.pid) for name, p in workers}
    for p in (bare, capped):
        p.stdin.write("0\n")
        p.stdin.flush()
    for name, p in workers:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    log = tail(errs[other], 1 << 20)
    result[other + "_stderr_tail"] = log[-4000:]
    result[base + "_stderr_tail"] = tail(errs[base], 2000)
    calls = call_counts(log)
    # Warm-up (12 steps) and the measured rounds: the steps the counts cover.
    total_steps = 12 + rounds * steps
    result["gpuslice_calls"] = calls
    result["gpuslice_calls_per_step"] = {k: round(v / total_steps, 2) for k, v in
                                         sorted(calls.items(), key=lambda kv: -kv[1])}
    ratios = [g / b for g, b in zip(result[other], result[base])]
    result["ratios"] = ratios
    result["median_ratio"] = statistics.median(ratios)
    result["median_" + base] = statistics.median(result[base])
    result["median_" + other] = statistics.median(result[other])
    target = 0.995 if pair == "enforcer" else 0.99
    result["pass"] = rounds >= 6 and result["median_ratio"] >= target
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps({k: result[k] for k in ("median_ratio", "median_" + base, "median_" + other, "pass")}))


if __name__ == "__main__":
    main()
