"""What the two Trainer-callback benchmarks share: the Trainer and scalekit runs of one model, and ABBA rounds.

hf_callback_agreement.py and hf_callback_overhead.py import this (`python benchmarks/NAME.py` puts this folder on sys.path).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models are built from configs: nothing to fetch

import torch  # noqa: E402
import transformers  # noqa: E402

from scalekit import RunConfig, run  # noqa: E402
from scalekit.hf import CorpusDataset, ScalekitCallback  # noqa: E402

SEED = 1337
LR = 1e-3
WARMUP = 3
LOG_EVERY = 5


def arguments(doc: str) -> argparse.Namespace:
    """The options both benchmarks take (the first line of `doc` describes the script), and a line saying them."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=["gpt2", "llama"], choices=["gpt2", "llama"])
    parser.add_argument("--preset", default="small", help="the scalekit preset whose shape the models take")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20, help="measured steps per run")
    parser.add_argument("--rounds", type=int, default=8)
    a = parser.parse_args()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} threads; "
          f"{a.preset} shape, batch {a.batch_size} × {a.seq_len} tokens, {a.steps} measured steps, {a.rounds} rounds")
    return a


class StepClock(transformers.TrainerCallback):
    """The bare recorder: the time of each step's end, nothing else."""

    def __init__(self):
        self.ends: list[float] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.ends.append(time.perf_counter())

    def median_interval_s(self) -> float:
        gaps = [b - a for a, b in zip(self.ends[WARMUP:], self.ends[WARMUP + 1:], strict=False)]
        return statistics.median(gaps)


def trainer(spec, batch: int, seq: int, steps: int, callbacks) -> transformers.Trainer:
    args = transformers.TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="scalekit-bench-"), per_device_train_batch_size=batch,
        max_steps=WARMUP + steps, logging_steps=LOG_EVERY, learning_rate=LR, seed=SEED, optim="adamw_torch",
        max_grad_norm=0.0, lr_scheduler_type="constant", use_cpu=True, report_to="none", save_strategy="no",
        disable_tqdm=True, dataloader_pin_memory=False)
    torch.manual_seed(SEED)
    return transformers.Trainer(model=spec.build(), args=args, train_dataset=CorpusDataset(seq), callbacks=callbacks)


def callback_tokens_per_s(spec, batch, seq, steps) -> float:
    gc.collect()
    cb = ScalekitCallback(warmup_steps=WARMUP)
    trainer(spec, batch, seq, steps, [cb]).train()
    return cb.result.tokens_per_s


def scalekit_tokens_per_s(spec, batch, seq, steps) -> float:
    gc.collect()
    cfg = RunConfig(model=spec, batch_size=batch, seq_len=seq, steps=steps, warmup_steps=WARMUP, log_every=LOG_EVERY,
                    lr=LR, seed=SEED, device="cpu", measure_memory=False)
    return run(cfg).tokens_per_s


def trainer_throughput(spec, batch, seq, steps, with_callback: bool) -> tuple[float, float]:
    """(steps/s from the bare recorder, the callback's own time as a share of the measured steps' time)."""
    gc.collect()
    clock = StepClock()
    cb = ScalekitCallback(warmup_steps=WARMUP) if with_callback else None
    trainer(spec, batch, seq, steps, [clock] + ([cb] if cb else [])).train()
    measured_s = clock.ends[-1] - clock.ends[WARMUP - 1]
    return 1 / clock.median_interval_s(), (cb.own_s / measured_s if cb else 0.0)


def abba(measure_a, measure_b, rounds: int) -> tuple[float, list[float], list, list]:
    """Rounds of A and B, the order flipped every round; (median of B/A per round, the ratios, A's, B's)."""
    a_runs, b_runs = [], []
    for i in range(rounds):
        if i % 2 == 0:
            a_runs.append(measure_a())
            b_runs.append(measure_b())
        else:
            b_runs.append(measure_b())
            a_runs.append(measure_a())
    key = (lambda v: v[0]) if isinstance(a_runs[0], tuple) else (lambda v: v)
    ratios = [key(b) / key(a) for a, b in zip(a_runs, b_runs, strict=True)]
    return statistics.median(ratios), ratios, a_runs, b_runs
