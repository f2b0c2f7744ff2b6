"""Does scalekit claim speed-ups from noise?  An A/A test on this machine, and a real slowdown found.

A/A: the same configuration measured as its own "toggle" (identical runs under two labels), compared by
`scalekit.compare(..., repeats=R)` exactly as a user would: paired rounds in alternating order, the 95%
interval, the verdict.  Every comparison whose verdict is "faster" or "slower" is a false claim; at the 95% level
they should be at most 5% of comparisons ("unreliable (machine busy)", one run each beside a busy loop, claims
nothing and is counted apart).  With `--load`, a busy-loop process runs beside it the whole time
(what a shared laptop or Binder does to a benchmark).  With `--slowdown 1.3`, the "toggle" sleeps 30% of the
baseline's step time in every step instead, and the count is of comparisons that found it slower.

The model is the tiny built-in GPT on the shipped corpus (through RunConfig(model=...), so that a sleep can
be put into its step); threads are scalekit's default (the cores other processes are not using).  The last line
is `false_claims=K/N` (A/A) or `detected=K/N` (with --slowdown).

    python benchmarks/aa_noise.py [--comparisons 20] [--repeats 3] [--load] [--slowdown 1.3]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

import torch

import scalekit
from scalekit import RunConfig
from scalekit.data import shakespeare_batches
from scalekit.measure.load import LoadMeter, auto_threads
from scalekit.measure.stats import BUSY_VERDICT
from scalekit.models import GPT, PRESETS

PRESET = "tiny"
STEPS, WARMUP_STEPS = 20, 3


def config(label: str, sleep_s: float = 0.0) -> RunConfig:
    p = PRESETS[PRESET]
    batches = {}

    def batch_fn(batch_size, device):
        if "it" not in batches:  # one stream of the shipped corpus per run, as the built-in data would be
            batches["it"] = shakespeare_batches(p.block_size, batch_size, 1337)
        return next(batches["it"])

    def loss_fn(model, batch):
        x, y = batch
        loss = model(x, y)[1]
        if sleep_s:
            time.sleep(sleep_s)  # the injected slowdown: part of the step's time, as a slower kernel would be
        return loss

    def build():
        batches.clear()
        torch.manual_seed(1337)
        return GPT(p.gpt_config())

    return RunConfig(model=build, batch_fn=batch_fn, loss_fn=loss_fn, batch_size=p.batch_size, steps=STEPS,
                     warmup_steps=WARMUP_STEPS, tokens_per_sample=p.block_size, device="cpu", measure_memory=False,
                     label=label)


def busy_loop() -> int:
    """A busy loop that is another process, not this one's child (the shell that starts it exits at once), as another
    user's job on a shared machine would be: scalekit's load meter counts it, and the run's threads leave it its core.
    (A child of this process would be taken for this run's own helper, as a DataLoader worker is.)"""
    shell = subprocess.run(["sh", "-c", f"'{sys.executable}' -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
                           capture_output=True, text=True, timeout=10, check=True)
    return int(shell.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--comparisons", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3, help="paired rounds per comparison (default 3)")
    parser.add_argument("--load", action="store_true", help="run a busy-loop process beside the measurements")
    parser.add_argument("--slowdown", type=float, default=None, metavar="X",
                        help="the toggle's steps take X times as long (a sleep): count the comparisons that find it")
    args = parser.parse_args()
    loop = busy_loop() if args.load else None
    try:
        time.sleep(1.0 if loop else 0.0)  # the loop is running before threads are chosen
        print(f"torch {torch.__version__}; {auto_threads()} thread(s); busy loop beside: {loop is not None}; "
              f"{args.comparisons} comparisons × {args.repeats} rounds")
        meter = LoadMeter()
        found = verdicts(args)
        load = meter.read()
        print(f"other processes used {load.other_cpu_cores:.2f} of {load.cores} cores on average")
    finally:
        if loop is not None:
            os.kill(loop, signal.SIGKILL)
    if args.slowdown:
        print(f"detected={sum(v == 'slower' for v in found)}/{len(found)}")
    else:
        print(f"{sum(v == BUSY_VERDICT for v in found)} {BUSY_VERDICT}")
        print(f"false_claims={sum(v in ('faster', 'slower') for v in found)}/{len(found)}")


def verdicts(args) -> list[str]:
    """The verdict of each comparison of the toggle against the baseline."""
    sleep_s = 0.0
    if args.slowdown:
        base = scalekit.run(config("calibration"))
        sleep_s = (args.slowdown - 1) * base.step_ms.median / 1e3
        print(f"baseline step {base.step_ms.median:.2f} ms: the toggle sleeps {1e3 * sleep_s:.2f} ms per step")
    found, speedups = [], []
    for i in range(args.comparisons):
        table = scalekit.compare([config("A"), config("B", sleep_s)], repeats=args.repeats)
        row = table.iloc[1]
        found.append(row["verdict"])
        speedups.append(row["speedup"])
        print(f"{i + 1:3}: {row['speedup']:.3f}× ({row['speedup_low']:.3f}–{row['speedup_high']:.3f}) "
              f"{row['verdict']}{'  [busy]' if 'busy' in str(row['note']) else ''}", flush=True)
    print(f"median speed-up {statistics.median(speedups):.3f}×")
    return found


if __name__ == "__main__":
    main()
