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

import argparse
import statistics

from hf_trainer_setup import abba, callback_tokens_per_s, scalekit_tokens_per_s, torch, transformers

from scalekit.hf import causal_lm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=["gpt2", "llama"], choices=["gpt2", "llama"])
    parser.add_argument("--preset", default="small", help="the scalekit preset whose shape the models take")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20, help="measured steps per run")
    parser.add_argument("--rounds", type=int, default=8)
    a = parser.parse_args()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} threads; "
          f"{a.preset} shape, batch {a.batch_size} × {a.seq_len} tokens, {a.steps} measured steps, {a.rounds} rounds")
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
