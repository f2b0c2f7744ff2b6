"""What does ScalekitCallback cost a Trainer run?

The Trainer's throughput with ScalekitCallback ÷ without it, same model, batch and data, side by side in one
process, in rounds whose order flips every round (ABBA); the figure is the median of the per-round ratios.
Both runs carry a bare recorder (one perf_counter per step end) that gives the throughput: the median
step-to-step interval after the warm-up, so the callback's FLOP count and memory probe (warm-up steps only)
are outside the figure, as they are outside its measurements.  The callback's own time in its hooks, as a
share of the measured steps' time, is printed beside it: the same cost, read directly.

The last line is `ratio=` the lowest over the families measured (with ÷ without: 0.99 means the callback costs 1%).

    python benchmarks/hf_callback_overhead.py [--families gpt2 llama] [--rounds N] [--preset small]
"""

from __future__ import annotations

import statistics

from hf_trainer_setup import abba, arguments, trainer_throughput

from scalekit.hf import causal_lm


def main() -> None:
    a = arguments(__doc__)
    lowest = float("inf")
    for family in a.families:
        shape = (causal_lm(family, a.preset), a.batch_size, a.seq_len, a.steps)
        trainer_throughput(*shape, with_callback=True)  # one untimed run: lazy imports, allocator
        ratio, ratios, _, with_cb = abba(lambda s=shape: trainer_throughput(*s, with_callback=False),
                                         lambda s=shape: trainer_throughput(*s, with_callback=True), a.rounds)
        own = statistics.median(share for _, share in with_cb)
        print(f"{family:6} Trainer steps/s with ÷ without the callback {ratio:.3f} (median of {a.rounds} rounds; from "
              f"{min(ratios):.3f} to {max(ratios):.3f}); the callback's own time: {100 * own:.3f}% of the measured steps")
        lowest = min(lowest, ratio)
    print(f"ratio={lowest:.3f}")


if __name__ == "__main__":
    main()
