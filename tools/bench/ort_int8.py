"""ONNX Runtime's own dynamic int8 quantization of a model.onnx, timed as `ringtune-bench int8`
times ours: samples/s at a batch (median of the repeats), batch-1 latency (p50, p99), file size.

Usage: python ort_int8.py MODEL.onnx [--threads 2 --batch 32 --seq 128 --steps 5 --repeats 3
--latency-runs 100]; prints one line `RESULT {json}`. Needs onnxruntime (and numpy).
"""

import argparse
import json
import os
import tempfile
import time

import numpy as np
import onnxruntime as ort
from onnxruntime.quantization import QuantType, quantize_dynamic


def batch(session, rows, seq, seed):
    """Random ids, lengths 40..seq padded to seq, two segments (as ringtune-bench's)."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((rows, seq), dtype=np.int64)
    mask = np.zeros((rows, seq), dtype=np.int64)
    types = np.zeros((rows, seq), dtype=np.int64)
    for r in range(rows):
        length = int(rng.integers(min(40, seq), seq + 1))
        ids[r, :length] = rng.integers(1000, 30000, size=length)
        mask[r, :length] = 1
        types[r, length // 2 : length] = 1
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    names = {i.name for i in session.get_inputs()}
    return {k: v for k, v in feeds.items() if k in names}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--latency-runs", type=int, default=100)
    a = p.parse_args()
    out = os.path.join(tempfile.mkdtemp(), "model.quant.onnx")
    quantize_dynamic(a.model, out, weight_type=QuantType.QInt8, per_channel=True)
    options = ort.SessionOptions()
    options.intra_op_num_threads = a.threads
    session = ort.InferenceSession(out, options, providers=["CPUExecutionProvider"])
    big, one = batch(session, a.batch, a.seq, 0), batch(session, 1, a.seq, 1)
    for _ in range(2):
        session.run(["logits"], big)
    rates = []
    for _ in range(max(a.repeats, 1)):
        start = time.perf_counter()
        for _ in range(max(a.steps, 1)):
            session.run(["logits"], big)
        rates.append(max(a.steps, 1) * a.batch / (time.perf_counter() - start))
    session.run(["logits"], one)
    lat = []
    for _ in range(max(a.latency_runs, 1)):
        start = time.perf_counter()
        session.run(["logits"], one)
        lat.append((time.perf_counter() - start) * 1e3)
    lat.sort()
    at = lambda q: lat[round((len(lat) - 1) * q)]
    rates.sort()
    result = {
        "samples_per_s": rates[len(rates) // 2],
        "p50_ms": at(0.5),
        "p99_ms": at(0.99),
        "bytes": os.path.getsize(out),
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
