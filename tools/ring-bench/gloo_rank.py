#!/usr/bin/env python3
"""One gloo rank of an all_reduce(SUM) measurement, for ring-bench's emulated cluster.

usage: python gloo_rank.py --rank R --world N --master HOST:PORT [--sizes 22000000,110000000]
       [--warmup 2] [--iters 5]
Every rank runs it in its own process (on loopback, or in its own emulated host); rank 0 prints
one `RESULT {json}` line per size with the median over the timed repeats of the slowest rank's
time, and the bus bandwidth. Before each timed all_reduce the ranks meet at a barrier; the
slowest rank's time stands for the collective.
"""
import argparse, json, os, statistics, time

import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--master", required=True)
    ap.add_argument("--sizes", default="22000000,110000000")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    a = ap.parse_args()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{a.master}", rank=a.rank, world_size=a.world)
    for n in (int(s) for s in a.sizes.split(",")):
        x = torch.empty(n, dtype=torch.float32)
        times = []
        for i in range(a.warmup + a.iters):
            x.fill_(float(a.rank + 1))
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(x, op=dist.ReduceOp.SUM)
            t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            if i >= a.warmup:
                times.append(float(t))
        if a.rank == 0:
            med = statistics.median(times)
            bus = n * 4 / med * 2 * (a.world - 1) / a.world / 1e9
            print("RESULT " + json.dumps(dict(elems=n, median_s=med, busbw_GBps=bus)), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
