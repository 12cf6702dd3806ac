#!/usr/bin/env python3
"""Kill -> next step: how long the survivors of a killed node take to train on.

Four ranks of `ringtune train` on loopback, launched torchrun-style (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, RINGTUNE_CERTS) into one output folder with `--min-nodes 2`; once the
lead has logged step S, rank R gets SIGKILL, and the time from the kill to the next step record
in `metrics.jsonl` is measured from outside (what a user sees), beside the run's own
`recovery_s` (from the failure found to that step, in `summary.json`). Each run is checked: the
survivors exit 0 and the summary records the change. A run without a kill checks that a peer
timeout does not drop a live node under load.

    kill_recovery.py --ringtune target/release/ringtune --peer-timeout 2 3 4 \
        --run 2@25 --run 0@40 [--run none] -- --max-steps 50 --eval-steps 20

Arguments after `--` go to every rank. Prints one table row per run.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

WORLD = 4


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def step_records(path, seen):
    """The step numbers of step records added to `path` since `seen` bytes."""
    try:
        with open(path, "rb") as f:
            f.seek(seen)
            data = f.read()
    except FileNotFoundError:
        return [], seen
    end = data.rfind(b"\n") + 1
    steps = []
    for line in data[:end].splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("kind") == "step":
            steps.append(record["step"])
    return steps, seen + end


def one_run(args, certs, victim, at_step, peer_timeout, extra):
    out = tempfile.mkdtemp(prefix="kill-recovery-")
    port = free_port()
    ranks = []
    logs = []
    for rank in range(WORLD):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), RINGTUNE_CERTS=certs)
        log = open(os.path.join(out, f"rank-{rank}.log"), "w")
        logs.append(log)
        cmd = [args.ringtune, "train", "--min-nodes", "2", "--threads", "1", "--log-every", "1",
               "--peer-timeout", str(peer_timeout), "--output", os.path.join(out, "run")] + extra
        ranks.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
    metrics = os.path.join(out, "run", "metrics.jsonl")
    seen, last_step, killed_at, next_after = 0, 0, None, None
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        steps, seen = step_records(metrics, seen)
        now = time.monotonic()
        if steps:
            last_step = max(steps)
            if killed_at is not None and next_after is None:
                next_after = now - killed_at
        if victim is not None and killed_at is None and last_step >= at_step:
            ranks[victim].send_signal(signal.SIGKILL)
            killed_at = time.monotonic()
        if all(p.poll() is not None for i, p in enumerate(ranks) if i != victim):
            break
        time.sleep(0.01)
    for p in ranks:
        if p.poll() is None:
            p.kill()
        p.wait()
    for log in logs:
        log.close()
    codes = [p.returncode for i, p in enumerate(ranks) if i != victim]
    try:
        with open(os.path.join(out, "run", "summary.json")) as f:
            summary = json.load(f)
    except (FileNotFoundError, ValueError):
        summary = {}
    changes = summary.get("membership", [])
    return {
        "victim": victim,
        "killed_after_step": at_step if victim is not None else None,
        "peer_timeout_s": peer_timeout,
        "kill_to_next_step_s": next_after,
        "recovery_s": changes[0]["recovery_s"] if changes else None,
        "survivors_exit": codes,
        "changes": [(c["step"], c["left"], c["nodes"]) for c in changes],
        "steps": summary.get("steps"),
        "dev": (summary.get("dev") or {}).get("accuracy"),
        "output": out,
    }


def prune(run):
    """Removes what a run wrote but its records (metrics.jsonl, summary.json): checkpoints and
    the model take about 0.5 GB a run."""
    if not os.path.isdir(run):
        return
    for name in os.listdir(run):
        path = os.path.join(run, name)
        if name in ("metrics.jsonl", "summary.json"):
            continue
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.remove(path)


def main():
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ringtune", default="target/release/ringtune")
    parser.add_argument("--peer-timeout", type=float, nargs="+", default=[4.0])
    parser.add_argument("--run", action="append", default=[], help="RANK@STEP, or none (no kill)")
    parser.add_argument("--timeout", type=float, default=900, help="longest run, seconds")
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--keep", action="store_true",
                        help="keep each run's folder (logs, checkpoints, model: about 0.5 GB); else only its logs and records")
    args = parser.parse_args(argv)
    certs = tempfile.mkdtemp(prefix="kill-recovery-certs-")
    subprocess.run([args.ringtune, "certs", "--nodes", str(WORLD), "--out", certs], check=True,
                   stdout=subprocess.DEVNULL)
    rows = []
    print("| peer timeout | kill | kill to next step | recovery_s | survivors exit | change (step, left, nodes) | steps | dev acc |")
    print("|---|---|---|---|---|---|---|---|")
    for peer_timeout in args.peer_timeout:
        for spec in args.run or ["2@25"]:
            victim, at_step = (None, None) if spec == "none" else (int(spec.split("@")[0]), int(spec.split("@")[1]))
            row = one_run(args, certs, victim, at_step, peer_timeout, extra)
            if not args.keep:
                prune(os.path.join(row["output"], "run"))
            rows.append(row)
            kill = "-" if victim is None else f"rank {victim} after step {at_step}"
            fmt = lambda v: "-" if v is None else f"{v:.2f} s"
            print(f"| {peer_timeout:g} s | {kill} | {fmt(row['kill_to_next_step_s'])} | {fmt(row['recovery_s'])} | "
                  f"{row['survivors_exit']} | {row['changes']} | {row['steps']} | {row['dev']} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
