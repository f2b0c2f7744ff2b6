"""Measuring on a busy machine: rows repeated in alternating order, threads pinned and restored, the machine's
load recorded and said, and only like compared with like."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time

import pytest
import torch

import scalekit
from scalekit import ConfigError, RunConfig
from scalekit.cli.main import main
from scalekit.inference import GenerateResult, compare_generations
from scalekit.measure import load
from scalekit.measure.load import LoadMeter, MachineLoad
from scalekit.measure.timing import Spread
from scalekit.training.report import results_table
from scalekit.training.results import RunResult, StepRecord, compare

QUICK = dict(preset="tiny", steps=4, warmup_steps=1, log_every=2, device="cpu", measure_memory=False)


@pytest.fixture
def no_collection(monkeypatch):
    """Each run ends with a full garbage collection (its memory handed back): the slowest part of a tiny run,
    and nothing these tests look at."""
    import gc

    monkeypatch.setattr(gc, "collect", lambda *a: 0)


def test_the_ladder_repeats_its_rows_in_alternating_order(monkeypatch, no_collection):
    import scalekit.training.ladder

    order, real = [], scalekit.training.ladder.run

    def recording(cfg, **kwargs):
        order.append((cfg.label, cfg.measure_memory))
        return real(cfg, **kwargs)

    monkeypatch.setattr(scalekit.training.ladder, "run", recording)
    rows = scalekit.training.ladder.ladder(RunConfig(**{**QUICK, "measure_memory": True}), rungs=("tf32", "fused_adamw"),
                                  repeats=3)
    assert [label for label, _ in order] == ["baseline", "+ fused_adamw", "+ fused_adamw", "baseline", "baseline",
                                             "+ fused_adamw"]
    assert [probed for _, probed in order] == [True, True, False, False, False, False]  # later rounds: timed only
    assert rows[1].status == "skipped" and not rows[1].rounds  # tf32: not on a CPU, not repeated
    assert [len(r.timing_rounds()) for r in (rows[0], rows[2])] == [3, 3]
    assert all(len(r) == 4 for r in rows[2].timing_rounds())
    table = results_table(rows)
    assert "3 paired rounds in alternating order" in table and "95% interval" in table.splitlines()[0]
    frame = compare(rows)
    assert frame.loc[2, "verdict"] in ("faster", "slower", "within noise") and frame.loc[0, "verdict"] == "baseline"
    assert frame.loc[2, "speedup_low"] <= frame.loc[2, "speedup"] <= frame.loc[2, "speedup_high"]


def test_compare_measures_configurations_in_rounds_and_refuses_repeats_of_results(no_collection):
    frame = scalekit.compare([RunConfig(**QUICK), RunConfig(**QUICK, toggles=["fused_adamw"])], repeats=2)
    assert list(frame["run"]) == ["baseline", "fused_adamw"] and frame.loc[1, "verdict"] != "not compared"
    done = scalekit.run(RunConfig(**QUICK))
    with pytest.raises(ConfigError, match="repeats= measures configurations again"):
        scalekit.compare([done, done], repeats=3)
    with pytest.raises(ConfigError, match="compare\\(repeats=\\) must be a whole number of rounds"):
        scalekit.compare([RunConfig(**QUICK)], repeats=0)


def test_a_bad_repeats_flag_is_one_line_naming_it(capsys):
    assert main(["ladder", "--repeats", "0", "--device", "cpu"]) == 2
    assert "--repeats must be a whole number of rounds from 1 to 100, got 0" in capsys.readouterr().err


def test_threads_are_pinned_for_the_run_recorded_and_restored(no_collection):
    before = torch.get_num_threads()
    seen = []
    cfg = RunConfig(**QUICK, threads=1, model=lambda: torch.nn.Linear(1, 1), batch_size=1,
                    batch_fn=lambda b, d: torch.ones(b, 1),
                    loss_fn=lambda m, b: (seen.append(torch.get_num_threads()), m(b).square().mean())[1])
    result = scalekit.run(cfg)
    assert result.threads == 1 and set(seen) == {1} and torch.get_num_threads() == before
    failing = RunConfig(**{**QUICK, "preset": "auto"}, threads=1, model=lambda: torch.nn.Linear(1, 1), batch_size=1,
                        batch_fn=lambda b, d: torch.ones(b, 1), loss_fn=lambda m, b: 1 / 0)
    assert scalekit.run(failing, catch_errors=True).status == "failed" and torch.get_num_threads() == before
    auto = scalekit.run(RunConfig(**QUICK))
    assert auto.threads == min(load.auto_threads(), before) >= 1  # None: decided once per process, for every row
    torch.set_num_threads(1)  # a caller's own setting is the most None takes
    try:
        assert scalekit.run(RunConfig(**QUICK)).threads == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ConfigError, match="RunConfig.threads must be a positive integer"):
        RunConfig(threads=0)
    with pytest.raises(ConfigError, match="GenerateConfig.threads must be a positive integer"):
        scalekit.GenerateConfig(threads="2")


@contextlib.contextmanager
def busy_loops(count: int = 1):
    """`count` busy loops that are not this process's children (the shell that started each has exited): other
    processes, as the load meter counts them, each spinning on a core until the block ends."""
    pids = []
    try:
        for _ in range(count):
            shell = subprocess.run(["sh", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
                                   capture_output=True, text=True, timeout=10)
            pids.append(int(shell.stdout.strip()))
        yield
    finally:
        for pid in pids:
            subprocess.run(["kill", "-9", str(pid)], check=False)


def test_another_process_busy_beside_a_run_is_recorded_and_said():
    with busy_loops():
        meter = LoadMeter()
        time.sleep(1.0)
        seen = meter.read()
    assert seen.other_cpu_cores >= 0.6 and seen.cores >= 1
    busy = MachineLoad(other_cpu_cores=1.5, cores=2, wall_s=3.0)
    assert busy.busy and busy.note == "the machine was busy (other processes used 1.5 of 2 cores): timings unreliable"
    assert not MachineLoad(other_cpu_cores=0.3, cores=2, wall_s=3.0).busy
    assert not MachineLoad(other_cpu_cores=3.0, cores=16, wall_s=3.0).busy  # a quarter of the machine at most


def sleepy_config(label: str, step_s: float = 0.03) -> RunConfig:
    """A run whose steps mostly wait (the load meter needs a run of MIN_WALL_S or more to say anything)."""
    def loss(model, batch):
        time.sleep(step_s)
        return model(batch).square().mean()

    return RunConfig(**{**QUICK, "preset": "auto", "steps": 8}, threads=1, model=lambda: torch.nn.Linear(1, 1),
                     batch_size=1, batch_fn=lambda b, d: torch.ones(b, 1), loss_fn=loss, label=label)


def test_beside_a_real_busy_loop_one_run_each_is_unreliable_and_rounds_keep_their_verdict(no_collection):
    from scalekit.course.chapter import finding
    from scalekit.measure.stats import BUSY_VERDICT

    # enough loops to make the machine busy by the meter's own rule (one on a 2-core machine)
    with busy_loops(int(load.BUSY_SHARE * load.cores()) + 1):
        a, b = scalekit.run(sleepy_config("A")), scalekit.run(sleepy_config("B", step_s=0.02))
        rows = scalekit.compare([sleepy_config("A"), sleepy_config("B", step_s=0.02)], repeats=2)
    assert a.ok and b.ok and a.load.busy and b.load.busy, (a.load, b.load)
    frame = compare([a, b])
    assert frame.loc[1, "verdict"] == BUSY_VERDICT and frame.loc[1, "speedup_low"] <= frame.loc[1, "speedup_high"]
    assert finding(b, a).startswith(f"B against A: {BUSY_VERDICT}")
    assert rows.loc[1, "verdict"] in ("faster", "slower", "within noise"), rows.loc[1, "verdict"]
    assert "the machine was busy" in rows.loc[1, "note"]


def scripted_run(label: str, step_ms: list[float], threads: int = 1, tokens: int = 512, busy: bool = False):
    steps = [StepRecord(step=i, warmup=False, step_ms=ms, tokens_per_s=tokens / ms * 1e3, loss=None, mem_bytes=None,
                        tokens=tokens) for i, ms in enumerate(step_ms)]
    return RunResult(label=label, config={}, device="cpu", steps=steps, step_ms=Spread.of(step_ms),
                     tokens_per_step=tokens, tokens_per_s=tokens / Spread.of(step_ms).median * 1e3, threads=threads,
                     load=MachineLoad(1.5 if busy else 0.0, 2, 3.0))


def test_runs_are_compared_like_for_like_or_not_at_all():
    base = scripted_run("base", [10.0, 11.0, 10.5, 9.5, 10.0, 10.2])
    double = scripted_run("twice the batch", [19.0, 21.0, 20.0, 20.5, 19.5, 20.1], tokens=1024)
    other_threads = scripted_run("two threads", [5.0, 5.5, 5.2, 4.9, 5.1, 5.0], threads=2, busy=True)
    frame = compare([base, double, other_threads])
    assert frame.loc[1, "speedup"] == pytest.approx(10.1 / 20.05 * 2, rel=1e-3)  # per token
    assert "per token: 1,024 against 512 tokens per step" in frame.loc[1, "note"]
    assert frame.loc[2, "verdict"] == "not compared" and "2 against 1 threads" in frame.loc[2, "note"]
    assert "the machine was busy" in frame.loc[2, "note"]
    table = results_table([base, double, other_threads])
    assert "during two threads: timings unreliable" in table and "one run each" in table


def scripted_generation(label: str, token_ms: list[float], new_tokens: int, batch: int = 1) -> GenerateResult:
    return GenerateResult(label=label, config={}, device="cpu", batch_size=batch, prompt_tokens=[6] * batch,
                          new_tokens=new_tokens, token_ms=token_ms, decode_ms=Spread.of(token_ms), ttft_ms=1.0,
                          decode_tokens_per_s=batch / Spread.of(token_ms).median * 1e3, threads=1)


def test_generations_of_different_lengths_are_not_compared():
    short = scripted_generation("20 tokens", [1.0, 1.1, 0.9, 1.0, 1.05, 0.95], 20)
    long = scripted_generation("301 tokens", [1.4, 1.5, 1.3, 1.4, 1.45, 1.35], 301)
    batched = scripted_generation("4 prompts", [2.0, 2.1, 1.9, 2.0, 2.05, 1.95], 20, batch=4)
    frame = compare_generations([short, long, batched])
    assert frame.loc[1, "verdict"] == "not compared" and "301 against 20 new tokens" in frame.loc[1, "note"]
    assert frame.loc[2, "speedup"] == pytest.approx(2.0) and "per token: a batch of 4 against 1" in frame.loc[2, "note"]


def test_the_lab_says_why_runs_of_different_lengths_have_no_speed_up():
    pytest.importorskip("ipywidgets")
    from scalekit.widgets.generate_table import results_frame, results_html

    frame = results_frame([(1, scripted_generation("a", [1.0] * 6, 20)), (2, scripted_generation("b", [1.2] * 6, 301))])
    assert "not compared: 301 against 20 new tokens" in results_html(frame)


@pytest.mark.slow
def test_the_aa_benchmark_runs_end_to_end_and_ends_with_its_count():
    root = __import__("pathlib").Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "benchmarks/aa_noise.py", "--comparisons", "1", "--repeats", "2"],
                          cwd=root, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last in ("false_claims=0/1", "false_claims=1/1"), proc.stdout[-2000:]
