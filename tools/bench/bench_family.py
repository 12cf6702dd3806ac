"""PyTorch beside `ringtune-bench table`: a `...ForSequenceClassification` built by transformers
from the `config.json` our row builds (random weights), trained or run under the same rules for
every family (BERT, MiniLM, RoBERTa, DeBERTa-v3, ModernBERT, ...).

usage: python bench_family.py --config models/roberta-base.json --task {train,eval} --prec {fp32,bf16}
       [--threads 2] [--batch N] [--seq 128] [--warmup 2] [--steps 5] [--repeats 3] [--max-wait 600]

The batch is the reference's and `ringtune-bench one`'s: random ids from 1000, lengths 40..seq
padded to seq with the config's padding id, two segments where the model reads token types.
Train: forward under bf16 autocast where asked, backward, AdamW (lr 2e-5, weight decay 0.01),
zero_grad. Eval: a forward under inference mode. Before each repeat it waits (at most --max-wait s)
until other processes use under 10% of the CPUs. Prints one JSON line prefixed RESULT (median
samples/s, each repeat's, the phases, the peak RSS in MiB).
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch
import transformers
from transformers import AutoConfig, AutoModelForSequenceClassification


def make_batch(config, rows, seq, generator, with_types):
    pad = config.pad_token_id if config.pad_token_id is not None else 0
    ids = torch.randint(1000, config.vocab_size, (rows, seq), generator=generator)
    lengths = torch.randint(min(40, seq), seq + 1, (rows,), generator=generator)
    positions = torch.arange(seq).unsqueeze(0)
    mask = (positions < lengths.unsqueeze(1)).long()
    ids = torch.where(mask.bool(), ids, torch.full_like(ids, pad))
    batch = dict(input_ids=ids, attention_mask=mask, labels=torch.randint(0, 2, (rows,), generator=generator))
    if with_types:
        batch["token_type_ids"] = ((positions >= (lengths // 2).unsqueeze(1)) & mask.bool()).long()
    return batch


def cpu_ticks():
    """(busy, total) ticks of every CPU, and this process's own."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    t = os.times()
    return sum(v[:8]) - v[3] - v[4], sum(v[:8]), (t.user + t.system) * os.sysconf("SC_CLK_TCK")


def foreign_share(before, after):
    busy = max(0.0, (after[0] - before[0]) - (after[2] - before[2]))
    return busy / max(1, after[1] - before[1])


def wait_idle(max_wait, threshold=0.10):
    start = time.time()
    while True:
        before = cpu_ticks()
        time.sleep(1.0)
        if foreign_share(before, cpu_ticks()) < threshold or time.time() - start > max_wait:
            return round(time.time() - start, 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--task", default="train", choices=["train", "eval"])
    ap.add_argument("--prec", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-wait", type=float, default=600)
    a = ap.parse_args()
    rows = a.batch or (32 if a.task == "train" else 64)

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    with open(a.config) as f:
        keys = json.load(f)
    keys.pop("architectures", None)
    config = AutoConfig.for_model(**keys, num_labels=2)
    model = AutoModelForSequenceClassification.from_config(config)
    with_types = getattr(config, "type_vocab_size", 0) > 1
    batch = make_batch(config, rows, a.seq, torch.Generator().manual_seed(0), with_types)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    optimizer = None
    if a.task == "train":
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01)
    else:
        model.eval()

    def autocast():
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.prec == "bf16")

    phases = {"fwd": [], "bwd": [], "opt": []}

    def train_step(record):
        t0 = time.perf_counter()
        with autocast():
            loss = model(**batch).loss
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        if record:
            phases["fwd"].append(t1 - t0)
            phases["bwd"].append(t2 - t1)
            phases["opt"].append(t3 - t2)

    def eval_step(record):
        t0 = time.perf_counter()
        with torch.inference_mode(), autocast():
            model(**inputs).logits.float().sum().item()
        if record:
            phases["fwd"].append(time.perf_counter() - t0)

    step = train_step if a.task == "train" else eval_step
    for _ in range(a.warmup):
        step(False)
    repeats, foreign, waited = [], [], []
    for r in range(a.repeats):
        waited.append(wait_idle(a.max_wait))
        step(False)  # caches warm again after the wait
        before = cpu_ticks()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            step(True)
        elapsed = time.perf_counter() - t0
        foreign.append(round(foreign_share(before, cpu_ticks()), 3))
        repeats.append(a.steps * rows / elapsed)
        print(f"# repeat {r}: {repeats[-1]:.2f} samples/s, others used {foreign[-1]:.1%}", file=sys.stderr, flush=True)

    result = dict(
        config=a.config, model_type=config.model_type, task=a.task, prec=a.prec, batch=rows, seq=a.seq,
        threads=torch.get_num_threads(), params=sum(p.numel() for p in model.parameters()),
        attn_impl=getattr(model.config, "_attn_implementation", None),
        repeats_sps=[round(x, 3) for x in repeats], median_sps=round(statistics.median(repeats), 3),
        phase_median_s={k: round(statistics.median(v), 4) for k, v in phases.items() if v},
        foreign_cpu_share=foreign, idle_wait_s=waited,
        maxrss_MiB=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        torch=torch.__version__, transformers=transformers.__version__,
    )
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
