"""scalekit's fastest generation against transformers' generate(), on the same weights and prompts.

The shipped model's weights go into transformers' GPT2LMHeadModel (scalekit.inference.hf_gpt2: the same
architecture, Conv1D weights transposed), which generates with its own cache (DynamicCache, SDPA attention,
greedy).  scalekit generates with its best configuration here: a static KV cache, the decode step compiled,
inference_mode.  Both produce the same greedy tokens (checked every round), at batch 1 and batch 8 (eight
prompts of equal length: no padding on either side), side by side in one process.

Decode tokens/s on both sides: batch × (new tokens − 1) ÷ the time from the first new token to the last, so
the prefill is left out of both; transformers' steps are timed by a logits processor that reads the clock
at every step (it runs after each step's forward).  Runs come in rounds of one of each, the order flipped
every round (ABBA); the figure is the median of the rounds' ratios (scalekit ÷ transformers), and the
last line is the lower of the two batch sizes' ratios, as `ratio=1.23`.

    python benchmarks/generate_vs_hf.py [--new-tokens 200] [--rounds 6] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from scalekit.data import load_tokens
from scalekit.inference import GenerateConfig, generate
from scalekit.inference.config import corpus_tokenizer
from scalekit.inference.hf_gpt2 import to_gpt2lmhead
from scalekit.models import load_pretrained

BEST = {"kv_cache": "static", "compile": "default", "inference_mode": True}
PROMPT_CHARS = 12


def prompts(batch: int) -> list[str]:
    """`batch` different prompts of equal length: consecutive slices of the held-out text."""
    tok = corpus_tokenizer()
    text = tok.decode(np.asarray(load_tokens("val")[: batch * PROMPT_CHARS]).tolist())
    return [text[i * PROMPT_CHARS:(i + 1) * PROMPT_CHARS] for i in range(batch)]


def scalekit_run(batch: int, new_tokens: int) -> tuple[float, list[list[int]]]:
    cfg = GenerateConfig(prompts=prompts(batch), max_new_tokens=new_tokens, toggles=BEST, device="cpu",
                         warmup_tokens=8, quality=False, measure_memory=False)
    r = generate(cfg)
    assert r.status == "ok", r.error
    decode_s = r.total_s - r.ttft_ms / 1e3  # from the first new token to the last, as on the other side
    return batch * (new_tokens - 1) / decode_s, r.token_ids


class StepClock:
    """A transformers LogitsProcessor that only reads the clock: called once per generated token."""

    def __init__(self):
        self.times: list[float] = []

    def __call__(self, input_ids, scores):
        self.times.append(time.perf_counter())
        return scores


def hf_run(peer, batch: int, new_tokens: int) -> tuple[float, list[list[int]]]:
    from transformers import LogitsProcessorList

    tok = corpus_tokenizer()
    ids = torch.tensor([tok.encode(p) for p in prompts(batch)])
    clock = StepClock()
    with torch.inference_mode():
        out = peer.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                            min_new_tokens=new_tokens, do_sample=False, use_cache=True, pad_token_id=0,
                            logits_processor=LogitsProcessorList([clock]))
    # the clock runs after each step's forward, before its token is chosen: first to last is new_tokens − 1 steps
    return batch * (new_tokens - 1) / (clock.times[-1] - clock.times[0]), out[:, ids.shape[1]:].tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} threads; "
          f"scalekit: {' + '.join(BEST)}; transformers: generate(use_cache=True), SDPA")
    peer = to_gpt2lmhead(load_pretrained(), attn_implementation="sdpa")
    worst = float("inf")
    for batch in args.batches:
        hf_run(peer, batch, 16)  # warm-up: the first call of each side pays its one-time costs
        scalekit_run(batch, 16)
        ours, theirs = [], []
        for i in range(args.rounds):
            if i % 2 == 0:  # ABBA: the order flips every round
                s, s_tokens = scalekit_run(batch, args.new_tokens)
                h, h_tokens = hf_run(peer, batch, args.new_tokens)
            else:
                h, h_tokens = hf_run(peer, batch, args.new_tokens)
                s, s_tokens = scalekit_run(batch, args.new_tokens)
            assert s_tokens == h_tokens, "scalekit and transformers disagree on the greedy tokens"
            ours.append(s)
            theirs.append(h)
        ratios = [s / h for s, h in zip(ours, theirs, strict=True)]
        ratio = statistics.median(ratios)
        worst = min(worst, ratio)
        print(f"batch {batch}: scalekit {statistics.median(ours):9,.0f} tok/s   transformers "
              f"{statistics.median(theirs):9,.0f} tok/s   ratio {ratio:.2f} (median of {args.rounds} rounds, "
              f"{min(ratios):.2f} to {max(ratios):.2f}; {args.new_tokens} new tokens, same greedy tokens)")
    print(f"ratio={worst:.2f}")


if __name__ == "__main__":
    main()
