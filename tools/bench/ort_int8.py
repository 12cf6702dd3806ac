"""ONNX Runtime's own dynamic int8 quantization of a model.onnx (int8 weights per channel),
timed as `ringtune-bench int8` times ours (see int8_timing.py).

Usage: python ort_int8.py MODEL.onnx [--threads 2 --batch 32 --seq 128 --shortest 40 --steps 5 --repeats 3
--latency-runs 100]. Needs onnxruntime (and numpy).
"""

import os
import tempfile

import onnxruntime as ort
from onnxruntime.quantization import QuantType, quantize_dynamic

from int8_timing import arguments, measure, report, synthetic_feeds


def main():
    a = arguments(__doc__).parse_args()
    out = os.path.join(tempfile.mkdtemp(), "model.quant.onnx")
    quantize_dynamic(a.source, out, weight_type=QuantType.QInt8, per_channel=True)
    options = ort.SessionOptions()
    options.intra_op_num_threads = a.threads
    session = ort.InferenceSession(out, options, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}

    def feeds(rows, seed):
        return {k: v for k, v in synthetic_feeds(rows, a.seq, seed, a.shortest).items() if k in names}

    timed = measure(lambda f: session.run(["logits"], f), feeds(a.batch, 0), feeds(1, 1), a)
    report("ONNX Runtime quantize_dynamic", timed, os.path.getsize(out))


if __name__ == "__main__":
    main()
