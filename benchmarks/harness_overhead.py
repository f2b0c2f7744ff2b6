"""What does scalekit's harness cost? Its measured training throughput against a bare PyTorch loop.

Same model, data, batch, seed and step count, side by side in one process.  Runs come in rounds of one
bare and one scalekit run, the order flipped every round (ABBA) so that drift in the machine's speed and
whatever the first run of a pair leaves behind hit both sides alike; each round gives a ratio, and the
median of the rounds' ratios is the figure (on a 2-core machine single rounds scatter by several percent).
Throughput on both sides is wall-clock: tokens of the measured steps divided by the wall time of the
measured loop, so everything the harness does between steps (timers, records, loss reads, stop checks) is
inside scalekit's figure.  Both sides compute on the same number of threads (scalekit's choice for this machine,
or --threads), which the bare loop sets itself.  The last line is the worst ratio over the presets measured, as
`ratio=0.99` (scalekit ÷ bare; ≥ 0.98 means the harness costs ≤ 2%).

    python benchmarks/harness_overhead.py [--presets tiny medium] [--rounds N] [--threads N]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch

from scalekit import RunConfig, run
from scalekit.data import shakespeare_batches
from scalekit.measure.load import auto_threads
from scalekit.models import GPT, PRESETS

SETTINGS = {  # steps per run and rounds: enough for a stable median on these CPUs without taking all day
    "tiny": dict(steps=150, warmup_steps=10, rounds=16),
    "small": dict(steps=60, warmup_steps=5, rounds=10),
    "medium": dict(steps=10, warmup_steps=2, rounds=6),
    "gpt2-124m": dict(steps=20, warmup_steps=5, rounds=6),
}
LOG_EVERY = 10
SEED = 1337
LR = 1e-3


def bare_tokens_per_s(preset: str, steps: int, warmup_steps: int) -> float:
    """A hand-written nanoGPT-style loop: the reference scalekit is held against."""
    p = PRESETS[preset]
    gc.collect()  # both sides start from a clean heap: no garbage of the previous run collected mid-loop
    torch.manual_seed(SEED)
    batches = shakespeare_batches(p.block_size, p.batch_size, SEED)
    model = GPT(p.gpt_config())
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)

    def step():
        x, y = next(batches)
        _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    for _ in range(warmup_steps):
        step()
    t0 = time.perf_counter()
    for i in range(steps):
        loss = step()
        if (i + 1) % LOG_EVERY == 0:
            loss.item()
    elapsed = time.perf_counter() - t0
    return steps * p.batch_size * p.block_size / elapsed


def scalekit_tokens_per_s(preset: str, steps: int, warmup_steps: int) -> float:
    gc.collect()
    cfg = RunConfig(preset=preset, steps=steps, warmup_steps=warmup_steps, log_every=LOG_EVERY, seed=SEED, lr=LR,
                    device="cpu", data="shakespeare", measure_memory=False, threads=torch.get_num_threads())
    return run(cfg).tokens_per_s_wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["tiny", "medium"], choices=list(SETTINGS))
    parser.add_argument("--rounds", type=int, default=None, help="rounds per preset (default: per preset)")
    parser.add_argument("--threads", type=int, default=None, help="threads on both sides (default: scalekit's choice)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads or auto_threads())  # the bare loop's; scalekit's runs are given the same
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    worst = float("inf")
    for preset in args.presets:
        s = dict(SETTINGS[preset])
        rounds = args.rounds or s.pop("rounds")
        s.pop("rounds", None)
        bare_tokens_per_s(preset, **s)  # one untimed pair first: page cache, allocator, lazy imports
        scalekit_tokens_per_s(preset, **s)
        bare_runs, kit_runs = [], []
        for i in range(rounds):
            if i % 2 == 0:
                bare_runs.append(bare_tokens_per_s(preset, **s))
                kit_runs.append(scalekit_tokens_per_s(preset, **s))
            else:
                kit_runs.append(scalekit_tokens_per_s(preset, **s))
                bare_runs.append(bare_tokens_per_s(preset, **s))
        ratios = [k / b for b, k in zip(bare_runs, kit_runs, strict=True)]
        ratio = statistics.median(ratios)
        worst = min(worst, ratio)
        print(f"{preset:10} bare {statistics.median(bare_runs):12,.0f} tok/s   scalekit "
              f"{statistics.median(kit_runs):12,.0f} tok/s   ratio {ratio:.3f} (median of {rounds} rounds × "
              f"{s['steps']} steps; rounds from {min(ratios):.3f} to {max(ratios):.3f})")
    print(f"ratio={worst:.2f}")


if __name__ == "__main__":
    main()
