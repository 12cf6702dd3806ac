"""PyTorch's dynamic int8 quantization (`torch.ao.quantization.quantize_dynamic` of every
`nn.Linear` with its default settings, as its tutorial and most users run it: int8 weights per
tensor, activations quantized per batch) of a Hugging Face sequence classifier, and the same
model in fp32, timed as `ringtune-bench int8` times ours (see int8_timing.py).

SOURCE is a folder with config.json (a run folder or a checkpoint: its model.safetensors is read
when there, else the weights are seeded) or a config file. Usage: python torch_int8.py SOURCE
[--threads 2 --batch 32 --seq 128 --shortest 40 --steps 5 --repeats 3 --latency-runs 100]. Needs torch and
transformers.
"""

import inspect
import os
import tempfile

import torch
from transformers import AutoConfig, AutoModelForSequenceClassification

from int8_timing import arguments, measure, report, synthetic_feeds


def load(source):
    if os.path.isdir(source) and os.path.isfile(os.path.join(source, "model.safetensors")):
        return AutoModelForSequenceClassification.from_pretrained(source)
    torch.manual_seed(0)
    return AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(source))


def size(model):
    path = os.path.join(tempfile.mkdtemp(), "state.pt")
    torch.save(model.state_dict(), path)
    return os.path.getsize(path)


def main():
    a = arguments(__doc__).parse_args()
    torch.set_num_threads(a.threads)
    fp32 = load(a.source).eval()
    int8 = torch.ao.quantization.quantize_dynamic(fp32, {torch.nn.Linear}, dtype=torch.qint8)
    names = inspect.signature(fp32.forward).parameters  # MPNet's has no token_type_ids

    def feeds(rows, seed):
        return {k: torch.from_numpy(v) for k, v in synthetic_feeds(rows, a.seq, seed, a.shortest).items() if k in names}

    big, one = feeds(a.batch, 0), feeds(1, 1)
    with torch.inference_mode():
        for name, model in (("PyTorch fp32", fp32), ("PyTorch quantize_dynamic", int8)):
            report(name, measure(lambda f: model(**f).logits, big, one, a), size(model))


if __name__ == "__main__":
    main()
