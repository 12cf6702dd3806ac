"""What `ringtune-bench int8`'s Python rows share: the arguments it passes, the synthetic batches
it times (as ringtune-bench's own: random ids, lengths 40..seq padded to seq, two segments), and
the timing rules (samples/s at a batch, the median of the repeats; batch-1 latency p50 and p99).
A script prints one line `RESULT {json}` per model it times.
"""

import argparse
import json
import time

import numpy as np


def arguments(description):
    """The command line every Python row takes; `source` is the model to quantize."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("source")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--shortest", type=int, default=40, help="real tokens of the shortest row")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--latency-runs", type=int, default=100)
    return p


def synthetic_feeds(rows, seq, seed, shortest=40):
    """input_ids, attention_mask and token_type_ids as int64 arrays of shape (rows, seq)."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((rows, seq), dtype=np.int64)
    mask = np.zeros((rows, seq), dtype=np.int64)
    types = np.zeros((rows, seq), dtype=np.int64)
    for r in range(rows):
        length = int(rng.integers(min(shortest, seq), seq + 1))
        ids[r, :length] = rng.integers(1000, 30000, size=length)
        mask[r, :length] = 1
        types[r, length // 2 : length] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def measure(run, big, one, a):
    """Times `run(feeds)` on the batch `big` and at batch 1 on `one`, by the bench's rules."""
    steps, repeats, latency_runs = max(a.steps, 1), max(a.repeats, 1), max(a.latency_runs, 1)
    for _ in range(2):
        run(big)
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            run(big)
        rates.append(steps * a.batch / (time.perf_counter() - start))
    run(one)
    lat = []
    for _ in range(latency_runs):
        start = time.perf_counter()
        run(one)
        lat.append((time.perf_counter() - start) * 1e3)
    lat.sort()
    rates.sort()
    at = lambda q: lat[round((len(lat) - 1) * q)]
    return {"samples_per_s": rates[len(rates) // 2], "p50_ms": at(0.5), "p99_ms": at(0.99)}


def report(name, timed, size):
    """Prints one model's result line for ringtune-bench."""
    print("RESULT " + json.dumps({"name": name, **timed, "bytes": size}), flush=True)
