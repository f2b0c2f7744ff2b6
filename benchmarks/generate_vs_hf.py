"""scalekit's fastest generation against transformers' generate(), on the same weights and prompts.

The shipped model's weights go into transformers' GPT2LMHeadModel (scalekit.inference.hf_gpt2: the same
architecture, Conv1D weights transposed), which generates two ways: its default (DynamicCache, SDPA
attention, greedy), and its documented fast path (`cache_implementation="static"` with the forward compiled,
`model.forward = torch.compile(model.forward)`); the ratio is against the faster of the two.  scalekit
generates with its best configuration here: a static KV cache, SDPA attention, the decode step compiled,
inference_mode.  All produce the same greedy tokens (checked every round), at batch 1 and batch 8 (eight
prompts of equal length: no padding on either side), side by side in one process.

Decode tokens/s on both sides: batch × (new tokens − 1) ÷ the time from the first new token to the last, so
the prefill is left out of both; transformers' steps are timed by a logits processor that reads the clock
at every step (it runs after each step's forward).  Runs come in rounds of one of each, the order flipped
every round (ABBA); the figure is the median of the rounds' ratios (scalekit ÷ the faster transformers
side), and the last line is the lower of the batch sizes' ratios, as `ratio=1.23`.

    python benchmarks/generate_vs_hf.py [--new-tokens 200] [--rounds 6] [--threads 1] [--no-fast-path]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import time

import numpy as np
import torch

from scalekit.data import load_tokens
from scalekit.inference import GenerateConfig, generate
from scalekit.inference.config import corpus_tokenizer
from scalekit.inference.hf_gpt2 import to_gpt2lmhead
from scalekit.models import load_pretrained

BEST = {"kv_cache": "static", "sdpa": True, "compile": "default", "inference_mode": True}
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


def hf_run(peer, batch: int, new_tokens: int, ids: torch.Tensor | None = None,
           static: bool = False) -> tuple[float, list[list[int]]]:
    """transformers' greedy generate() on `peer`, timed step by step; static: its StaticCache
    (cache_implementation="static"), as its compiled fast path takes it."""
    from transformers import LogitsProcessorList

    if ids is None:
        tok = corpus_tokenizer()
        ids = torch.tensor([tok.encode(p) for p in prompts(batch)])
    clock = StepClock()
    fast = {"cache_implementation": "static"} if static else {}
    with torch.inference_mode():
        out = peer.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                            min_new_tokens=new_tokens, do_sample=False, use_cache=True, pad_token_id=0,
                            eos_token_id=None, logits_processor=LogitsProcessorList([clock]), **fast)
    # the clock runs after each step's forward, before its token is chosen: first to last is new_tokens − 1 steps
    return batch * (new_tokens - 1) / (clock.times[-1] - clock.times[0]), out[:, ids.shape[1]:].tolist()


@contextlib.contextmanager
def keeping_compiled_code():
    """scalekit's compile toggle resets dynamo at every build (earlier runs' guards would otherwise count against
    the recompile limit), which would throw away transformers' compiled forward between the rounds: here dynamo
    is not reset, and its recompile limit is raised so that scalekit's fresh builds all compile."""
    reset, limit = torch._dynamo.reset, torch._dynamo.config.recompile_limit
    torch._dynamo.reset = lambda: None
    torch._dynamo.config.recompile_limit = 1024
    try:
        yield
    finally:
        torch._dynamo.reset, torch._dynamo.config.recompile_limit = reset, limit


def fast_path(model):
    """transformers' documented fast path: the same model (a copy) with its forward compiled, for a StaticCache."""
    fast = copy.deepcopy(model)
    fast.forward = torch.compile(fast.forward)
    return fast


def abba(sides: dict, rounds: int) -> dict[str, list[float]]:
    """tokens/s of each side (name -> a function returning (tokens/s, tokens)) in `rounds` rounds, the order
    reversed every round; every side's greedy tokens must agree with the first's."""
    speeds: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for i in range(rounds):
        tokens = {}
        for name in names if i % 2 == 0 else names[::-1]:
            speed, tokens[name] = sides[name]()
            speeds[name].append(speed)
        first = tokens[names[0]]
        assert all(t == first for t in tokens.values()), f"the sides disagree on the greedy tokens: {list(tokens)}"
    return speeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--no-fast-path", dest="fast_path", action="store_false",
                        help="leave out transformers' static cache + compiled forward")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} threads; "
          f"scalekit: {' + '.join(BEST)}; transformers: generate(use_cache=True), SDPA"
          + ("; and its fast path: cache_implementation='static', forward compiled" if args.fast_path else ""))
    peer = to_gpt2lmhead(load_pretrained(), attn_implementation="sdpa")
    fast = fast_path(peer) if args.fast_path else None
    worst = float("inf")
    with keeping_compiled_code() if fast is not None else contextlib.nullcontext():
        worst = compare_batches(args, peer, fast)
    print(f"ratio={worst:.2f}")


def compare_batches(args, peer, fast) -> float:
    """Each batch size's ratio printed; the lowest returned."""
    worst = float("inf")
    for batch in args.batches:
        sides = {"scalekit": lambda b=batch, n=args.new_tokens: scalekit_run(b, n),
                 "transformers": lambda b=batch, n=args.new_tokens: hf_run(peer, b, n)}
        if fast is not None:
            sides["transformers fast path"] = lambda b=batch, n=args.new_tokens: hf_run(fast, b, n, static=True)
        for side in sides.values():  # warm-up: each side pays its one-time costs (compiling) here
            side()
        speeds = abba(sides, args.rounds)
        ratio, against = best_ratio(speeds)
        worst = min(worst, ratio)
        figures = "   ".join(f"{name} {statistics.median(v):9,.0f} tok/s" for name, v in speeds.items())
        print(f"batch {batch}: {figures}   ratio {ratio:.2f} against {against} (median of {args.rounds} rounds; "
              f"{args.new_tokens} new tokens, same greedy tokens)")
    return worst


def best_ratio(speeds: dict[str, list[float]]) -> tuple[float, str]:
    """scalekit's median ratio, round by round, against the faster of the other sides (by their medians)."""
    others = {n: v for n, v in speeds.items() if n != "scalekit"}
    against = max(others, key=lambda n: statistics.median(others[n]))
    ratios = [s / h for s, h in zip(speeds["scalekit"], others[against], strict=True)]
    return statistics.median(ratios), against


if __name__ == "__main__":
    main()
