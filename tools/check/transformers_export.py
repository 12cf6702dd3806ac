"""Loads a ringtune run's folder in transformers as its family's `...ForSequenceClassification`
and checks its logits against the run's `model.onnx` (ONNX Runtime) on the first pairs of a TSV.

Usage: python transformers_export.py RUN_DIR PAIRS.tsv [--rows 16] [--tolerance 1e-4]
(torch, transformers, tokenizers and onnxruntime; CPU is enough). Exits 1 when they differ.

The pairs are GLUE's MRPC layout (quality, id, id, sentence, sentence), tokenized by the run's
own `tokenizer.json` (truncated at 128) and padded with the config's padding id; the ONNX model
takes token types only where its family reads them.
"""
import argparse
import csv
import json
import os
import sys

import numpy as np
import onnxruntime as ort
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForSequenceClassification


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("pairs")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--tolerance", type=float, default=1e-4)
    a = ap.parse_args()
    with open(os.path.join(a.run, "config.json")) as f:
        config = json.load(f)
    tokenizer = Tokenizer.from_file(os.path.join(a.run, "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(128)
    with open(a.pairs, newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:a.rows + 1]
    encoded = [tokenizer.encode(r[3], r[4]) for r in rows]
    seq = max(len(e.ids) for e in encoded)
    pad = config.get("pad_token_id") or 0
    ids = np.full((len(encoded), seq), pad, dtype=np.int64)
    types = np.zeros_like(ids)
    mask = np.zeros_like(ids)
    for i, e in enumerate(encoded):
        ids[i, :len(e.ids)] = e.ids
        types[i, :len(e.ids)] = e.type_ids
        mask[i, :len(e.ids)] = 1

    model = AutoModelForSequenceClassification.from_pretrained(a.run, attn_implementation="eager").eval()
    name = type(model).__name__
    expected = config["architectures"][0]
    if name != expected:
        sys.exit(f"{a.run}: transformers loaded {name}, the config names {expected}")
    feeds = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}
    session = ort.InferenceSession(os.path.join(a.run, "model.onnx"), providers=["CPUExecutionProvider"])
    inputs = {i.name for i in session.get_inputs()}
    onnx_feeds = {"input_ids": ids, "attention_mask": mask}
    if "token_type_ids" in inputs:
        onnx_feeds["token_type_ids"] = types
        feeds["token_type_ids"] = torch.from_numpy(types)
    with torch.no_grad():
        theirs = model(**feeds).logits.numpy()
    ours = session.run(["logits"], onnx_feeds)[0]
    diff = float(np.abs(theirs - ours).max())
    print(f"{a.run}: {name}, {len(rows)} pairs of up to {seq} tokens, largest logit difference {diff:.2e}")
    if not diff <= a.tolerance:
        sys.exit(f"{a.run}: logits differ by {diff:.2e} (tolerance {a.tolerance:g})")


if __name__ == "__main__":
    main()
