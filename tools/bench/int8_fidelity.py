"""How faithfully int8 models reproduce a run's fp32 `model.onnx` on MRPC's dev file: accuracy,
F1, the predictions that changed, and the rms change of the logit margin (logit 1 - logit 0).

The batches are ringtune eval's (64 pairs in file order, padded with the model's pad token to
their longest, 128 tokens at most), built by Python's `tokenizers` from the run's `tokenizer.json`. With `--ort`, ONNX
Runtime's own `quantize_dynamic` of the run's `model.onnx` (int8 weights per channel) is scored
too, as this CPU runs it and as a VNNI CPU computes it: its int8 weights stored as uint8 around
128, which ONNX Runtime multiplies exactly on any x86 CPU (as `ringtune quantize --weights
unsigned` does for ours).

Usage: python int8_fidelity.py RUN DEV.tsv [MODEL.onnx ...] [--ort]. Needs onnxruntime, onnx,
numpy and tokenizers.
"""

import argparse
import json
import os
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic
from tokenizers import Tokenizer


def read_pairs(path):
    """MRPC's TSV: label, two ids, two sentences."""
    with open(path, encoding="utf-8-sig") as f:
        rows = [line.rstrip("\n").split("\t") for line in f.read().splitlines()[1:] if line.strip()]
    return np.array([int(r[0]) for r in rows]), [(r[3], r[4]) for r in rows]


def batches(run, pairs, names, rows=64, max_len=128):
    # Padded with the model's pad token, as ringtune pads: the per-batch quantization sees it.
    with open(os.path.join(run, "config.json")) as f:
        pad = json.load(f).get("pad_token_id", 0)
    tokenizer = Tokenizer.from_file(os.path.join(run, "tokenizer.json"))
    tokenizer.enable_truncation(max_len)
    tokenizer.no_padding()
    encodings = tokenizer.encode_batch(pairs)
    for start in range(0, len(encodings), rows):
        chunk = encodings[start : start + rows]
        width = max(len(e.ids) for e in chunk)
        feeds = {k: np.zeros((len(chunk), width), np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")}
        feeds["input_ids"][:] = pad
        for i, e in enumerate(chunk):
            n = len(e.ids)
            feeds["input_ids"][i, :n] = e.ids
            feeds["attention_mask"][i, :n] = 1
            feeds["token_type_ids"][i, :n] = e.type_ids
        yield {k: v for k, v in feeds.items() if k in names}


def margins(path, run, pairs):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.log_severity_level = 3
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    logits = np.concatenate([session.run(["logits"], f)[0] for f in batches(run, pairs, names)])
    return logits[:, 1] - logits[:, 0]


def scores(margin, labels):
    predicted = margin > 0
    tp = np.sum(predicted & (labels == 1))
    f1 = 2 * tp / (2 * tp + np.sum(predicted & (labels == 0)) + np.sum(~predicted & (labels == 1)))
    return np.mean(predicted == labels), f1


def ort_models(source, folder):
    """quantize_dynamic's model, and the same with its int8 weights as uint8 around 128."""
    signed = os.path.join(folder, "ort.onnx")
    quantize_dynamic(source, signed, weight_type=QuantType.QInt8, per_channel=True)
    model = onnx.load(signed)
    initializers = {i.name: i for i in model.graph.initializer}
    shifted = set()
    for node in model.graph.node:
        if node.op_type != "MatMulInteger":
            continue
        for name in (node.input[1], node.input[3]):  # the weight and its zero point
            if name in shifted:
                continue
            values = numpy_helper.to_array(initializers[name])
            assert values.dtype == np.int8, f"{name} is {values.dtype}"
            unsigned = (values.astype(np.int16) + 128).astype(np.uint8)
            initializers[name].CopyFrom(numpy_helper.from_array(unsigned, name))
            shifted.add(name)
    vnni = os.path.join(folder, "ort_vnni.onnx")
    onnx.save(model, vnni)
    return [("ONNX Runtime quantize_dynamic", signed), ("ONNX Runtime quantize_dynamic, as VNNI computes it", vnni)]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run")
    p.add_argument("dev")
    p.add_argument("models", nargs="*")
    p.add_argument("--ort", action="store_true")
    a = p.parse_args()
    labels, pairs = read_pairs(a.dev)
    reference = margins(os.path.join(a.run, "model.onnx"), a.run, pairs)
    accuracy, f1 = scores(reference, labels)
    print("| model | accuracy | F1 | predictions changed | margin change, rms |")
    print("|---|---|---|---|---|")
    print(f"| fp32 model.onnx | {accuracy:.4f} | {f1:.4f} | | |")
    models = [(m, m) for m in a.models]
    if a.ort:
        models += ort_models(os.path.join(a.run, "model.onnx"), tempfile.mkdtemp())
    for name, path in models:
        margin = margins(path, a.run, pairs)
        accuracy, f1 = scores(margin, labels)
        changed = int(np.sum((margin > 0) != (reference > 0)))
        rms = float(np.sqrt(np.mean((margin - reference) ** 2)))
        print(f"| {name} | {accuracy:.4f} | {f1:.4f} | {changed} | {rms:.3f} |", flush=True)


if __name__ == "__main__":
    main()
