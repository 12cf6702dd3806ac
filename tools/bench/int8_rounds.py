"""Throughput of ONNX models against the first one, alternating them round by round in one process:
on a shared machine a single timing moves by several percent, a ratio within a round much less.

Usage: python int8_rounds.py ROUNDS NAME=MODEL.onnx ... [--steps 5 --batch 32 --seq 128 --shortest 40 --threads 2].
Prints each model's median samples/s and the median (and range) of its per-round ratio to the
first. The batches are `ringtune-bench int8`'s synthetic ones (int8_timing.py). Needs onnxruntime.
"""

import argparse
import time

import numpy as np
import onnxruntime as ort

from int8_timing import synthetic_feeds


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("rounds", type=int)
    p.add_argument("models", nargs="+", help="NAME=MODEL.onnx")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--shortest", type=int, default=40, help="real tokens of the shortest row")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    sessions = {}
    for spec in a.models:
        name, path = spec.split("=", 1)
        options = ort.SessionOptions()
        options.intra_op_num_threads = a.threads
        options.log_severity_level = 3
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        names = {i.name for i in session.get_inputs()}
        feeds = {k: v for k, v in synthetic_feeds(a.batch, a.seq, 0, a.shortest).items() if k in names}
        session.run(["logits"], feeds)
        sessions[name] = (session, feeds)
    rates = {name: [] for name in sessions}
    for _ in range(a.rounds):
        for name, (session, feeds) in sessions.items():
            start = time.perf_counter()
            for _ in range(a.steps):
                session.run(["logits"], feeds)
            rates[name].append(a.steps * a.batch / (time.perf_counter() - start))
    first = next(iter(sessions))
    for name, r in rates.items():
        ratio = np.array(r) / np.array(rates[first])
        print(
            f"{name}: {np.median(r):.1f} samples/s; against {first}: {np.median(ratio):.3f}x "
            f"(rounds {ratio.min():.3f}-{ratio.max():.3f})"
        )


if __name__ == "__main__":
    main()
