"""PyTorch DDP beside ringtune: a BERT-family checkpoint fine-tuned on MRPC with ringtune's recipe,
on one node or on the nodes a torchrun-style launcher describes (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT: `ringtune-ring-bench --cluster netns ... -- python pytorch_ddp_mrpc.py ...` sets
them), gradients summed by stock DDP over gloo. What a user with CPU servers runs instead of us.

usage: python pytorch_ddp_mrpc.py --model DIR --mrpc DIR --output DIR [--seed 42]
       [--hook allreduce|bf16|powersgd] [--powersgd-rank 8] [--powersgd-start N] [--precision auto|bf16|fp32]
       [--group-by-length true|false] [--epochs 3] [--max-steps N] [--threads 1]

The recipe is ringtune's (`ringtune train`'s defaults, and its multi-node recipe): a global batch
of 32 split over the nodes (each node takes every WORLD_SIZE-th row of a global batch, as our
shards do), AdamW 1e-4 (betas 0.9/0.999, eps 1e-8, weight decay 0.01 except biases and
LayerNorm weights), 10% linear warmup then linear decay to 0, global-norm clipping 1.0, 3 epochs,
pairs truncated to 128 tokens, padding to the batch's longest, the model's dropout, and batches
grouped by length as ours are (runs of 50 global batches sorted longest first, the batches
shuffled within each run; the last short batch last). Precision: bf16 autocast where the CPU has
AVX512-BF16 or AMX (our `auto`), else fp32. The dev split is scored at every epoch's end, each
node scoring its share and the counts summed.

Hooks (`--hook`): `allreduce` is DDP's default (fp32 gradients), `bf16` its
`bf16_compress_hook`, `powersgd` its `powerSGD_hook` with PyTorch's recommended settings (error
feedback, warm start, the first 10% of the steps uncompressed: `start_powerSGD_iter`) at our
rank. PowerSGD runs with DDP's gradients in one bucket: with DDP's default 25 MB buckets gloo
aborted on a collective mismatch (2-core Zen 4, torch 2.15).

Rank 0 writes `summary.json` (the wall from the start of `main`, after the imports, to the last
score; the dev scores; the recipe; every evaluation's time; the mean step past the first tenth of
the steps split into forward, backward with DDP's overlapped sync, and optimizer) and prints one JSON line per evaluation and
one at the end.
"""
import argparse
import csv
import json
import os
import random
import time

import torch
import torch.distributed as dist
from safetensors.torch import load_file
from tokenizers import Tokenizer
from transformers import AutoConfig, AutoModelForSequenceClassification

# Global batches per run that grouping sorts together (ringtune's LENGTH_GROUP_BATCHES, Hugging
# Face's megabatches).
LENGTH_GROUP_BATCHES = 50


def boolean(text):
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r}: true or false")


def arguments(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a Hugging Face model folder (config.json, model.safetensors, tokenizer.json)")
    ap.add_argument("--mrpc", required=True, help="MRPC's GLUE folder (train.tsv, dev.tsv)")
    ap.add_argument("--output", required=True, help="where rank 0 writes summary.json")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--warmup", type=float, default=0.1)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--max-grad-norm", type=float, default=1.0)
    ap.add_argument("--max-len", type=int, default=128)
    ap.add_argument("--group-by-length", type=boolean, default=True)
    ap.add_argument("--hook", choices=["allreduce", "bf16", "powersgd"], default="powersgd")
    ap.add_argument("--powersgd-rank", type=int, default=8)
    ap.add_argument("--powersgd-start", type=int, default=-1,
                    help="PowerSGD's start_powerSGD_iter (default: a tenth of the steps, PyTorch's recommendation; at least 2)")
    ap.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: every epoch); the schedule is the whole run's")
    a = ap.parse_args(argv)
    if a.global_batch < 1 or a.epochs < 1 or a.max_len < 2:
        ap.error("--global-batch and --epochs are at least 1, --max-len at least 2")
    return a


def read(path):
    try:
        with open(path, encoding="utf-8-sig") as f:
            rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    except OSError as e:
        raise SystemExit(f"{path}: {e.strerror}; give MRPC's folder with --mrpc")
    examples = []
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != 5 or row[0] not in ("0", "1"):
            raise SystemExit(f"{path}, line {line}: not an MRPC row (label, id, id, sentence, sentence)")
        examples.append((row[3], row[4], int(row[0])))
    return examples


def encode(tok, examples):
    """Every pair's ids and token types (truncated), and its label."""
    encoded = tok.encode_batch([(a, b) for a, b, _ in examples])
    return [(e.ids, e.type_ids, y) for e, (_, _, y) in zip(encoded, examples)]


def bf16_native():
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def epoch_order(n, seed, epoch, global_batch, lengths, grouped):
    """The epoch's order of the n examples: shuffled by (seed, epoch), then grouped by length."""
    rng = random.Random(seed * 1_000_003 + epoch)
    order = list(range(n))
    rng.shuffle(order)
    if not grouped:
        return order
    whole = n // global_batch * global_batch
    out = []
    for start in range(0, whole, LENGTH_GROUP_BATCHES * global_batch):
        run = sorted(order[start:min(whole, start + LENGTH_GROUP_BATCHES * global_batch)], key=lambda i: -lengths[i])
        batches = [run[k:k + global_batch] for k in range(0, len(run), global_batch)]
        rng.shuffle(batches)
        out += [i for b in batches for i in b]
    return out + sorted(order[whole:], key=lambda i: -lengths[i])


def node_batches(order, global_batch, rank, world):
    """This node's share of each global batch: every world-th row from its rank."""
    for k in range(0, len(order), global_batch):
        share = order[k:k + global_batch][rank::world]
        if share:
            yield share


def tensors(encoded, idx, pad, with_types):
    n = max(len(encoded[i][0]) for i in idx)
    ids = torch.full((len(idx), n), pad, dtype=torch.long)
    types = torch.zeros_like(ids)
    mask = torch.zeros_like(ids)
    for k, i in enumerate(idx):
        e, t, _ = encoded[i]
        ids[k, :len(e)] = torch.tensor(e)
        types[k, :len(t)] = torch.tensor(t)
        mask[k, :len(e)] = 1
    feeds = {"input_ids": ids, "attention_mask": mask}
    if with_types:
        feeds["token_type_ids"] = types
    return feeds, torch.tensor([encoded[i][2] for i in idx])


def evaluate(model, encoded, rank, world, pad, with_types, autocast):
    """Accuracy, F1 and mean cross-entropy over the whole split, each node scoring every world-th
    example."""
    model.eval()
    # correct, true positives, false positives, false negatives, summed cross-entropy
    counts = torch.zeros(5, dtype=torch.float64)
    mine = list(range(rank, len(encoded), world))
    with torch.no_grad(), autocast():
        for k in range(0, len(mine), 64):
            feeds, y = tensors(encoded, mine[k:k + 64], pad, with_types)
            logits = model(**feeds).logits.float()
            p = logits.argmax(-1)
            loss = torch.nn.functional.cross_entropy(logits, y, reduction="sum")
            counts += torch.tensor([(p == y).sum(), ((p == 1) & (y == 1)).sum(), ((p == 1) & (y == 0)).sum(),
                                    ((p == 0) & (y == 1)).sum(), loss], dtype=torch.float64)
    if world > 1:
        dist.all_reduce(counts)
    model.train()
    correct, tp, fp, fn, loss = counts.tolist()
    return correct / len(encoded), 2 * tp / max(1.0, 2 * tp + fp + fn), loss / len(encoded)


def load_model(path, seed):
    cfg = AutoConfig.from_pretrained(path, num_labels=2)
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(cfg)
    state = load_file(os.path.join(path, "model.safetensors"))
    if any(k.startswith(model.base_model_prefix + ".") for k in state):
        model.load_state_dict(state, strict=False)
    else:
        model.base_model.load_state_dict(state, strict=False)
    return cfg, model


def comm_hook(model, a, steps):
    """Registers `--hook` on the DDP model; says what it is."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if a.hook == "bf16":
        model.register_comm_hook(dist.group.WORLD, default_hooks.bf16_compress_hook)
        return "DDP bf16_compress_hook"
    if a.hook == "powersgd":
        start = max(2, int(0.1 * steps) if a.powersgd_start < 0 else a.powersgd_start)
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=a.powersgd_rank,
                                            start_powerSGD_iter=start, use_error_feedback=True, warm_start=True,
                                            random_seed=a.seed)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        return f"DDP powerSGD_hook rank {a.powersgd_rank} from step {start}"
    return "DDP fp32 all-reduce"


def main(a):
    started = time.time()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    if world > 1:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0" if os.path.exists("/sys/class/net/eth0") else "lo")
        dist.init_process_group("gloo", rank=rank, world_size=world)
    if a.global_batch % world:
        raise SystemExit(f"--global-batch {a.global_batch} does not split over {world} nodes")
    bf16 = a.precision == "bf16" or (a.precision == "auto" and bf16_native())

    def autocast():
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)

    cfg, model = load_model(a.model, a.seed)
    with_types = cfg.model_type == "bert"
    pad = cfg.pad_token_id or 0
    tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    tok.enable_truncation(max_length=a.max_len, strategy="longest_first")
    tok.no_padding()
    train = encode(tok, read(os.path.join(a.mrpc, "train.tsv")))
    dev = encode(tok, read(os.path.join(a.mrpc, "dev.tsv")))
    lengths = [len(e[0]) for e in train]
    per_epoch = -(-len(train) // a.global_batch)
    steps = a.epochs * per_epoch
    warm = int(a.warmup * steps)
    exempt = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    decayed = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
    opt = torch.optim.AdamW([{"params": decayed, "weight_decay": a.weight_decay}, {"params": exempt, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.999), eps=1e-8)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: s / max(1, warm) if s < warm else max(0.0, (steps - s) / max(1, steps - warm)))
    sync = "none (one node)"
    if world > 1:
        # PowerSGD's factors of the whole model in one bucket (see the module's note).
        bucket_mb = 1024 if a.hook == "powersgd" else 25
        # The buffers (position and token type ids) are constants: not broadcast every step.
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_mb, broadcast_buffers=False)
        sync = comm_hook(model, a, steps)
    model.train()
    times = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
    # Steps are timed past the first tenth, where PowerSGD's uncompressed start ends.
    timed_from, timed = int(0.1 * steps), 0
    evaluations, step = [], 0
    for epoch in range(a.epochs):
        order = epoch_order(len(train), a.seed, epoch, a.global_batch, lengths, a.group_by_length)
        for idx in node_batches(order, a.global_batch, rank, world):
            feeds, y = tensors(train, idx, pad, with_types)
            t0 = time.perf_counter()
            with autocast():
                loss = model(**feeds, labels=y).loss
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.max_grad_norm)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            t3 = time.perf_counter()
            if step >= timed_from:
                for name, seconds in zip(times, (t1 - t0, t2 - t1, t3 - t2)):
                    times[name] += seconds
                timed += 1
            step += 1
            if a.max_steps and step >= a.max_steps:
                break
        accuracy, f1, loss = evaluate(model.module if world > 1 else model, dev, rank, world, pad, with_types,
                                      autocast)
        evaluations.append({"epoch": epoch + 1, "step": step, "elapsed_s": round(time.time() - started, 2),
                            "accuracy": round(accuracy, 4), "f1": round(f1, 4), "loss": round(loss, 6)})
        if rank == 0:
            print(json.dumps(evaluations[-1]), flush=True)
        if a.max_steps and step >= a.max_steps:
            break
    summary = {
        "tool": "pytorch",
        "wall_s": round(time.time() - started, 2),
        "dev": {"accuracy": evaluations[-1]["accuracy"], "f1": evaluations[-1]["f1"],
                "loss": evaluations[-1]["loss"]},
        "training": {"nodes": world, "global_batch": a.global_batch, "learning_rate": a.lr, "epochs": a.epochs,
                     "steps": step, "group_by_length": a.group_by_length, "sync": sync,
                     "powersgd_rank": a.powersgd_rank if world > 1 and a.hook == "powersgd" else None,
                     "precision": "bf16 autocast" if bf16 else "fp32", "threads": a.threads, "seed": a.seed},
        "evaluations": evaluations,
        "step_s": {name: round(seconds / max(1, timed), 4) for name, seconds in times.items()},
        "steps_timed": timed,
        "torch": torch.__version__,
    }
    if world > 1:
        dist.destroy_process_group()
    if rank == 0:
        os.makedirs(a.output, exist_ok=True)
        with open(os.path.join(a.output, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main(arguments())
