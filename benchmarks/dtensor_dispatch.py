"""Per-operator dispatch of a DTensor against a plain tensor on this CPU: the host work scalekit.predict does not count
for the modes built on DTensor (tensor parallelism's sharded blocks, the optimizer's step on FSDP2's sharded
parameters), named as the missing term of their misses in reference/predict_vs_measured_cpu.txt.

A small element-wise multiply, timed in a loop on one thread, as a plain tensor and as a DTensor sharded on a
one-rank gloo mesh (no communication: what is timed is DTensor's dispatch, its sharding propagation), in ABAB order,
the median of `--repeats` rounds each.

    python benchmarks/dtensor_dispatch.py [--ops 2000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch


def per_op_us(x, ops: int) -> float:
    for _ in range(50):  # warm-up: the first calls fill DTensor's sharding-propagation cache
        x = x * 1.0001
    start = time.perf_counter()
    for _ in range(ops):
        x = x * 1.0001
    return (time.perf_counter() - start) / ops * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        plain = torch.randn(64, 64)
        sharded = distribute_tensor(plain, init_device_mesh("cpu", (1,)), [Shard(0)])
        times: dict[str, list[float]] = {"plain tensor": [], "DTensor": []}
        for _ in range(args.repeats):  # ABAB: each round times both
            times["plain tensor"].append(per_op_us(plain, args.ops))
            times["DTensor"].append(per_op_us(sharded, args.ops))
    finally:
        dist.destroy_process_group()
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in med.items():
        print(f"{k:>13}: {v:.1f} µs per element-wise operator (median of {args.repeats}, {args.ops} ops each)")
    print(f"DTensor's dispatch costs {med['DTensor'] / med['plain tensor']:.1f}× a plain tensor's "
          f"(+{med['DTensor'] - med['plain tensor']:.1f} µs per operator), load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
