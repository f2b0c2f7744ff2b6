"""Does autotune find a configuration at least as fast as the best row of `scalekit ladder`?

For each preset: climb the training ladder and take its fastest row; let autotune search from the
baseline within a stated time budget; then measure the two winners side by side in this one process, in
rounds whose order alternates (ABBA), and take the median of the per-round ratios (autotune ÷ ladder).
The last line is the worst ratio over the presets, as `ratio=1.00` (≥ 1: autotune matched or beat the ladder).

    python benchmarks/autotune_vs_ladder.py [--presets tiny small] [--time-budget-s 240] [--rounds 6]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

import torch

from scalekit import RunConfig, run
from scalekit.autotune import autotune
from scalekit.training.ladder import ladder

STEPS = {"tiny": 30, "small": 12, "medium": 4}


def fastest_ladder_row(base: RunConfig):
    rows = [r for r in ladder(base) if r.status == "ok" and r.tokens_per_s]
    best = max(rows, key=lambda r: r.tokens_per_s)
    return best.label, dict(best.config["toggles"])


def paired_ratio(a: RunConfig, b: RunConfig, rounds: int) -> tuple[float, list[float]]:
    """Median over rounds of tokens/s(b) ÷ tokens/s(a), the order alternating every round."""
    ratios = []
    for k in range(rounds):
        first, second = (a, b) if k % 2 == 0 else (b, a)
        ra, rb = run(first), run(second)
        ta, tb = (ra.tokens_per_s, rb.tokens_per_s) if k % 2 == 0 else (rb.tokens_per_s, ra.tokens_per_s)
        ratios.append(tb / ta)
    return statistics.median(ratios), ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["tiny", "small"], choices=list(STEPS))
    parser.add_argument("--time-budget-s", type=float, default=240.0, help="autotune's budget per preset")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; autotune budget {args.time_budget_s:g} s")
    worst = float("inf")
    for preset in args.presets:
        base = RunConfig(preset=preset, steps=STEPS[preset], warmup_steps=3, measure_memory=False)
        label, ladder_toggles = fastest_ladder_row(base)
        tuned = autotune(base, time_budget_s=args.time_budget_s, run_steps=10_000, steps=STEPS[preset])
        ladder_cfg = dataclasses.replace(base, toggles=ladder_toggles, label="ladder's best")
        tuned_cfg = dataclasses.replace(tuned.best, steps=STEPS[preset], warmup_steps=3, measure_memory=False,
                                        label="autotune's best")
        ratio, ratios = paired_ratio(ladder_cfg, tuned_cfg, args.rounds)
        worst = min(worst, ratio)
        print(f"{preset:8} ladder's best: {label} {ladder_toggles}; autotune: {tuned.best.describe()} "
              f"(batch {tuned.best.batch_size}, {tuned.search.elapsed_s:.0f} s, {len(tuned.search.candidates)} "
              f"candidates); autotune ÷ ladder {ratio:.3f} (rounds {min(ratios):.3f}–{max(ratios):.3f})")
    print(f"ratio={worst:.2f}")


if __name__ == "__main__":
    main()
