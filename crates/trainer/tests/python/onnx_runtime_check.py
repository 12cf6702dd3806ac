"""A run's models as users load them in Python: onnx's full checker on model.onnx, ONNX Runtime's
quantize_dynamic of it, and the logits of model.onnx, model.int8.onnx and the quantized copy on
the batches ringtune scored (crates/trainer/tests/int8.rs compares them with ringtune's).

Usage: onnx_runtime_check.py RUN_DIR BATCHES_JSON OUT_JSON
BATCHES_JSON: [{"rows": r, "seq": s, "input_ids": [...], "token_type_ids": [...],
"attention_mask": [...]}, ...], each tensor [rows, seq] flattened. OUT_JSON gets each model's
logits, flattened in batch order.
"""

import json
import os
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import QuantType, quantize_dynamic


def logits(path, batches):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    wanted = [i.name for i in session.get_inputs()]
    out = []
    for b in batches:
        shape = (b["rows"], b["seq"])
        feeds = {name: np.asarray(b[name], dtype=np.int64).reshape(shape) for name in wanted}
        (result,) = session.run(["logits"], feeds)
        out.extend(float(x) for x in result.reshape(-1))
    return out


def main():
    run, batches_path, out_path = sys.argv[1:]
    with open(batches_path) as f:
        batches = json.load(f)
    model = os.path.join(run, "model.onnx")
    onnx.checker.check_model(model, full_check=True)
    with tempfile.TemporaryDirectory() as tmp:
        quantized = os.path.join(tmp, "model.quantize_dynamic.onnx")
        quantize_dynamic(model, quantized, weight_type=QuantType.QInt8)
        result = {
            "float": logits(model, batches),
            "int8": logits(os.path.join(run, "model.int8.onnx"), batches),
            "quantize_dynamic": logits(quantized, batches),
        }
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
