"""Regional compile's point: compile time.  Whole-model compile against compile='regional', cold, at two depths.

Each measurement runs in a fresh Python process with Inductor's on-disk caches disabled
(TORCHINDUCTOR_FORCE_DISABLE_CACHES=1), so neither run reuses the other's kernels; the order alternates (ABBA)
between rounds.  The figure is scalekit's `compile_s` (the first step minus a steady step) and the steady step
time of each.  Published: torchtitan compiles per block by default; PyTorch's regional-compilation recipe
reports a compile time that no longer grows with the number of repeated layers.  The last line is the
deepest preset's ratio, as `ratio=1.7` (whole ÷ regional compile seconds).

    python benchmarks/regional_compile.py [--presets tiny small] [--rounds 1] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = """
import json, torch
from scalekit import RunConfig, run
torch.set_num_threads({threads})
r = run(RunConfig(preset={preset!r}, batch_size=4, seq_len=64, steps=3, warmup_steps=1, device="cpu",
                  measure_memory=False, toggles={{"compile": {mode!r}}}))
assert r.status == "ok", r.error
print(json.dumps({{"compile_s": r.compile_s, "step_ms": r.median_step_ms}}))
"""


def cold(preset: str, mode: str, threads: int) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
    out = subprocess.run([sys.executable, "-c", CHILD.format(preset=preset, mode=mode, threads=threads)],
                         capture_output=True, text=True, env=env, check=True, timeout=900)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["tiny", "small"])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    ratio = None
    for preset in args.presets:
        seen: dict[str, list[dict]] = {"default": [], "regional": []}
        for k in range(args.rounds):
            for mode in (("default", "regional") if k % 2 == 0 else ("regional", "default")):
                seen[mode].append(cold(preset, mode, args.threads))
        whole, regional = (statistics.median(m["compile_s"] for m in seen[x]) for x in ("default", "regional"))
        steps = {x: statistics.median(m["step_ms"] for m in seen[x]) for x in seen}
        ratio = whole / regional
        print(f"{preset}: compile whole {whole:.1f} s, regional {regional:.1f} s (×{ratio:.2f}); steady step "
              f"{steps['default']:.2f} ms whole, {steps['regional']:.2f} ms regional")
    print(f"ratio={ratio:.2f}")


if __name__ == "__main__":
    main()
