"""The KV cache's speed-up for 1,000 new tokens of the shipped model: no cache against dynamic and static.

The same greedy generation three ways, side by side in one process: re-reading the whole sequence every
step (no cache), appending keys and values (kv_cache=dynamic), and a preallocated cache written in place
(kv_cache=static).  The figure is the time of the whole generation (prefill and every decode step, after
an unmeasured warm-up), and the speed-up is no-cache time ÷ cached time; the greedy tokens must be the
same for all three.  Rounds alternate the order (ABBA).  Published: ≈4.7× for 1,000 GPT-2 tokens on a T4.
The last line is the static cache's speed-up, as `ratio=40.1`; with --json PATH the figures are written
(with the date, machine and versions) for the course to show beside a reader's own measurement.

    python benchmarks/kv_cache_speedup.py [--new-tokens 1000] [--rounds 1] [--threads 1] [--json PATH]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics

import torch

from scalekit.files import write_atomic
from scalekit.inference import GenerateConfig, generate
from scalekit.machine.hardware import detect

PROMPT = "ROMEO:"
CASES = {"no cache": {}, "kv_cache=dynamic": {"kv_cache": "dynamic"}, "kv_cache=static": {"kv_cache": "static"}}


def timed(toggles: dict, new_tokens: int) -> tuple[float, list[int]]:
    cfg = GenerateConfig(prompts=PROMPT, max_new_tokens=new_tokens, toggles=toggles, device="cpu", warmup_tokens=8,
                         quality=False, measure_memory=False)
    r = generate(cfg)
    assert r.status == "ok", r.error
    return r.total_s, r.token_ids[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=1, help="rounds of the three (the no-cache one takes longest)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--json", default=None, help="write the figures to this file")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; shipped model, {args.new_tokens} new tokens")
    seconds: dict[str, list[float]] = {name: [] for name in CASES}
    tokens = {}
    for i in range(args.rounds):
        for name in (list(CASES) if i % 2 == 0 else list(CASES)[::-1]):
            s, tokens[name] = timed(CASES[name], args.new_tokens)
            seconds[name].append(s)
    assert tokens["kv_cache=dynamic"] == tokens["no cache"] == tokens["kv_cache=static"], "the tokens differ"
    median = {name: statistics.median(v) for name, v in seconds.items()}
    speedup = {name: median["no cache"] / median[name] for name in CASES}
    for name in CASES:
        print(f"{name:18} {median[name]:8.2f} s  {args.new_tokens / median[name]:9.1f} tok/s  "
              f"speed-up {speedup[name]:6.2f}×")
    if args.json:
        hw = detect("cpu")
        doc = {"what": f"greedy generation of {args.new_tokens} new tokens after {PROMPT!r}, shipped model, "
                       f"whole generation time (prefill + decode), median of {args.rounds} round(s)",
               "seconds": median, "speedup": speedup, "same_tokens": True, "threads": torch.get_num_threads(),
               "device": hw.device_name, "cpu_count": hw.cpu_count, "torch": torch.__version__,
               "python": platform.python_version(), "date": datetime.datetime.now(datetime.UTC).isoformat(
                   timespec="seconds"), "script": "benchmarks/kv_cache_speedup.py",
               "command": "python benchmarks/kv_cache_speedup.py " + " ".join(
                   f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None and k != "json")}
        write_atomic(args.json, lambda f: json.dump(doc, f, indent=1))
    print(f"ratio={speedup['kv_cache=static']:.1f}")


if __name__ == "__main__":
    main()
