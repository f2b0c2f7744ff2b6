"""Does ScalekitCallback measure a Trainer run as scalekit measures its own?

The callback's tokens/s for a Hugging Face Trainer run ÷ scalekit's tokens/s for the same model (built from the
same config), batch and sequence length, the same optimizer (torch AdamW), on the shipped corpus; the Trainer
without gradient clipping and with a constant learning rate (scalekit does neither).  Measured side by side in
one process, in rounds whose order flips every round (ABBA); the figure is the median of the per-round ratios.
What each side times: scalekit a whole step including fetching its batch, the callback the Trainer's
on_step_begin to on_step_end (the batch is fetched before it); tokens/s is tokens per step ÷ the median step.

The last line is `ratio=` the ratio furthest from 1 over the families measured (1.00: they agree).

    python benchmarks/hf_callback_agreement.py [--families gpt2 llama] [--rounds N] [--preset small]
"""

from __future__ import annotations

import statistics

from hf_trainer_setup import (
    abba,
    arguments,
    callback_tokens_per_s,
    scalekit_tokens_per_s,
)

from scalekit.hf import causal_lm


def main() -> None:
    a = arguments(__doc__)
    furthest = 1.0
    for family in a.families:
        shape = (causal_lm(family, a.preset), a.batch_size, a.seq_len, a.steps)
        callback_tokens_per_s(*shape), scalekit_tokens_per_s(*shape)  # one untimed pair: lazy imports, allocator
        ratio, ratios, kit, cb = abba(lambda s=shape: scalekit_tokens_per_s(*s),
                                      lambda s=shape: callback_tokens_per_s(*s), a.rounds)
        print(f"{family:6} callback {statistics.median(cb):9,.0f} tok/s, scalekit {statistics.median(kit):9,.0f} tok/s; "
              f"callback ÷ scalekit {ratio:.3f} (median of {a.rounds} rounds; from {min(ratios):.3f} to "
              f"{max(ratios):.3f})")
        furthest = ratio if abs(ratio - 1) > abs(furthest - 1) else furthest
    print(f"ratio={furthest:.3f}")


if __name__ == "__main__":
    main()
