"""Speculative decoding on the shipped model: the draft model and prompt lookup against plain greedy decoding.

The same greedy generation three ways, side by side in one process, with a static KV cache each: plain
decoding (one forward of the model per token), speculative with the shipped draft `shakespeare-char-draft`
(k draft tokens, then one verification), and prompt lookup (k tokens copied from an earlier match of the last
n-gram).  The greedy tokens must be the same for all three (asserted).  The figure is the time of the whole
generation after an unmeasured warm-up; rounds alternate the order (ABBA); the speed-up is plain time ÷
speculative time, the median of the rounds (and per decode token, the mean over each round's tokens, with its
95% interval over the paired rounds and a verdict: a speculative round's time is shared by the tokens it made,
so the mean, not the median, is the honest per-token figure), with the acceptance (draft tokens kept ÷ proposed), the mean kept
per verification, the model's forwards per token and the draft's share of the time.  On a CPU at this size
a forward's cost is mostly fixed overhead, so the 1-layer draft is not much cheaper than the 4-layer model:
whether speculation pays is the ratio of the two costs against the acceptance.  Published (gpt-fast, A100):
Llama-2-70B int4 25.25 tok/s alone, 48.4 with a 7B draft.  The last line is the draft's, as `ratio=0.62`.

    python benchmarks/speculative.py [--new-tokens 300] [--k 4] [--rounds 3] [--threads 1] [--prompt TEXT]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from scalekit.inference import GenerateConfig, generate
from scalekit.measure.stats import speedup_interval, verdict

PROMPT = "ROMEO:\nI will not stay, I will not stay, I will not stay.\n\nJULIET:\n"


def cases(k: int) -> dict[str, dict]:
    return {"plain": {"kv_cache": "static"}, "draft": {"kv_cache": "static", "speculative": f"draft,k={k}"},
            "prompt lookup": {"kv_cache": "static", "speculative": f"prompt_lookup,k={k}"}}


def timed(toggles: dict, new_tokens: int, prompt: str):
    cfg = GenerateConfig(prompts=prompt, max_new_tokens=new_tokens, toggles=toggles, device="cpu", warmup_tokens=8,
                         quality=False, measure_memory=False)
    r = generate(cfg)
    assert r.status == "ok", r.error
    return r


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=300)
    parser.add_argument("--k", type=int, default=4, help="draft tokens per verification")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three, the order alternating")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--prompt", default=PROMPT)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); shipped model, {args.new_tokens} new "
          f"tokens, k={args.k}, {args.rounds} rounds (ABBA)")
    runs = cases(args.k)
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    steps: dict[str, list[list[float]]] = {name: [] for name in runs}  # each round's per-token times
    last = {}
    for i in range(args.rounds):
        for name in (list(runs) if i % 2 == 0 else list(runs)[::-1]):
            last[name] = timed(runs[name], args.new_tokens, args.prompt)
            seconds[name].append(last[name].total_s)
            steps[name].append(last[name].token_ms)
    assert last["draft"].token_ids == last["plain"].token_ids == last["prompt lookup"].token_ids, "the tokens differ"
    median = {name: statistics.median(v) for name, v in seconds.items()}
    for name in runs:
        r = last[name]
        line = f"{name:14} {median[name]:7.3f} s  {args.new_tokens / median[name]:8.1f} tok/s  " \
               f"speed-up {median['plain'] / median[name]:5.2f}×"
        interval = speedup_interval(steps["plain"], steps[name], statistic=statistics.mean)
        if name != "plain" and interval is not None:
            line += f" (per token {interval.estimate:.2f}×, 95% {interval.low:.2f}–{interval.high:.2f}: {verdict(interval)})"
        if r.acceptance_rate is not None:
            line += (f"  acceptance {r.acceptance_rate:.2f}  kept/verification {r.accepted_per_verification:.2f}  "
                     f"model forwards/token {r.target_forwards_per_token:.2f}  draft {r.draft_ms / 1e3 / r.total_s:.0%} "
                     f"of the time  kept 0..k: {r.accepted_counts}")
        print(line)
    print(f"same tokens: yes; ratio = plain time ÷ speculative time, median of {args.rounds} rounds")
    print(f"ratio={median['plain'] / median['draft']:.2f}")


if __name__ == "__main__":
    main()
