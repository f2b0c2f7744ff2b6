"""scalekit's generation on a Hugging Face Llama against that model's own generate(), same weights, same tokens.

A LlamaForCausalLM built offline from a config in the shape of a scalekit preset (random weights: speed does
not depend on what they are).  scalekit generates through the model's family (scalekit.hf.HFCausalLM):
transformers' own StaticCache, SDPA attention, the decode step compiled, inference_mode.  transformers
generates two ways: its default (DynamicCache) and its documented fast path (`cache_implementation="static"`
with `model.forward = torch.compile(model.forward)`).  Every round checks that all three make the same greedy
tokens; rounds alternate their order (ABBA); decode tokens/s leaves the prefill out on every side (the
helpers of generate_vs_hf.py).  The last line is scalekit's median ratio against the faster transformers side,
at the lowest of the batch sizes, as `ratio=1.23`.

    python benchmarks/generate_hf_llama.py [--preset small] [--new-tokens 64] [--rounds 4] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics

import torch
from generate_vs_hf import abba, best_ratio, fast_path, hf_run, keeping_compiled_code

from scalekit.hf import model_config
from scalekit.inference import GenerateConfig, generate

BEST = {"kv_cache": "static", "sdpa": True, "compile": "default", "inference_mode": True}
PROMPT_TOKENS = 16


def prompt_ids(batch: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(batch)
    return torch.randint(0, vocab, (batch, PROMPT_TOKENS), generator=g).tolist()


def scalekit_side(model, prompts, new_tokens: int):
    cfg = GenerateConfig(model=model, prompts=prompts, max_new_tokens=new_tokens, toggles=BEST, device="cpu",
                         warmup_tokens=8, quality=False, measure_memory=False)

    def run():
        r = generate(cfg)
        assert r.status == "ok", r.error
        return len(prompts) * (new_tokens - 1) / (r.total_s - r.ttft_ms / 1e3), r.token_ids

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small", help="the scalekit preset the Llama's shape follows")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    torch.manual_seed(0)
    # no end-of-sequence id: every side makes exactly the tokens asked for (with one, min_new_tokens would mask
    # its logit on transformers' side only, and the greedy tokens could differ)
    config = model_config("llama", args.preset, eos_token_id=None)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} threads; "
          f"LlamaForCausalLM ({args.preset}: {sum(p.numel() for p in model.parameters()):,} parameters); scalekit: "
          f"{' + '.join(BEST)}; transformers: generate() and its fast path (static cache, forward compiled)")
    fast = fast_path(model)
    worst = float("inf")
    with keeping_compiled_code():
        for batch in args.batches:
            prompts = prompt_ids(batch, model.config.vocab_size)
            ids = torch.tensor(prompts)
            sides = {"scalekit": scalekit_side(model, prompts, args.new_tokens),
                     "transformers": lambda b=batch, i=ids: hf_run(model, b, args.new_tokens, ids=i),
                     "transformers fast path": lambda b=batch, i=ids: hf_run(fast, b, args.new_tokens, ids=i,
                                                                             static=True)}
            for side in sides.values():  # warm-up: compilation happens here
                side()
            speeds = abba(sides, args.rounds)
            ratio, against = best_ratio(speeds)
            worst = min(worst, ratio)
            figures = "   ".join(f"{name} {statistics.median(v):8,.0f} tok/s" for name, v in speeds.items())
            print(f"batch {batch}: {figures}   ratio {ratio:.2f} against {against} (median of {args.rounds} "
                  f"rounds; {args.new_tokens} new tokens, same greedy tokens)")
    print(f"ratio={worst:.2f}")


if __name__ == "__main__":
    main()
