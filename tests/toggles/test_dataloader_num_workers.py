"""dataloader_num_workers: the same batches in the same order as without them, and no process outlives its run
(success, failure, a killed worker, Stop in the Lab, Ctrl-C), also when forked after torch ran threads."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from scalekit import RunConfig, run
from scalekit.errors import ConfigError
from tests.forking import deadline
from tests.helpers import CPU, SHAPES, assert_same, batches, built, tiny

RAW = dict(data="shakespeare-raw", transform_rounds=1)
DEADLINE_S = 120


@pytest.fixture(autouse=True)
def no_process_left_behind():
    """Each test has a deadline and must leave no child process behind, even when it fails."""
    with deadline(DEADLINE_S, "test still running"):
        yield
    left = psutil.Process().children(recursive=True)
    for p in left:
        p.kill()
    assert not left, f"processes left behind: {left}"


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def gone(pids, within_s: float = 10.0) -> bool:
    """All `pids` have exited (and been reaped) within `within_s` seconds."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
            return True
        time.sleep(0.05)
    return False


def started(cmd: list[str]) -> subprocess.Popen:
    """`cmd` in a session of its own (its Ctrl-C reaches its process group only), its output read here, with
    faulthandler on: SIGABRT makes it print every thread's stack, so that a run that does not end says where."""
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "PYTHONFAULTHANDLER": "1"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=env, preexec_fn=_ctrl_c_as_a_terminal_sends_it)


def _ctrl_c_as_a_terminal_sends_it() -> None:
    """In the child: SIGINT's default action, whatever this process's was (an ignored SIGINT is inherited, and the
    child's Ctrl-C would then reach nothing)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupted(proc: subprocess.Popen, within_s: float = 60) -> tuple[str, str]:
    """Ctrl-C to proc's process group; its (stdout, stderr) once it has ended.  A process still running after
    `within_s` fails the test with its threads' stacks, and is killed and reaped (no zombie left to the next)."""
    os.killpg(proc.pid, signal.SIGINT)
    try:
        return proc.communicate(timeout=within_s)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGABRT)  # faulthandler prints the stacks, then the process ends
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        ended(proc)
        out, err = proc.communicate()
        raise AssertionError(f"still running {within_s:g} s after Ctrl-C; its stacks:\n{err[-6000:]}\n{out[-2000:]}") from None


def ended(proc: subprocess.Popen) -> None:
    """proc's process group killed if it still runs, and proc reaped."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


class Watcher:
    """An on_step callback that records the run's child processes while it runs (and can act on a step)."""

    def __init__(self, at_step: int | None = None, action=None):
        self.seen: set[int] = set()
        self.at_step, self.action = at_step, action

    def __call__(self, record):
        self.seen |= children()
        if record.step == self.at_step and self.action is not None:
            self.action(self)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 3 workers on a 2-core machine, on purpose
def test_workers_give_the_same_batches_in_the_same_order_as_no_workers():
    # across several epochs, with the per-sample transform in the workers, and with the batch one
    from tests.helpers import N_BATCHES

    serial = batches(tiny(**SHAPES))
    assert_same(serial, batches(tiny(**SHAPES, toggles={"dataloader_num_workers": 2})))
    assert_same(serial, batches(tiny(**SHAPES, toggles={"dataloader_num_workers": 3, "vectorized_transforms": True})))
    assert len(serial) == N_BATCHES


def test_the_same_workers_serve_the_whole_run_across_epochs_and_end_with_it():
    cfg = tiny(seq_len=4096, batch_size=100, **RAW, toggles={"dataloader_num_workers": 2})
    with built(cfg) as ctx:
        loader = ctx.batch_counter.source
        pids = loader.worker_pids()
        assert len(pids) == 2 and set(pids) <= children()
        for _ in range(6):  # 600 windows: more than two epochs of 245
            next(ctx.batches)
        assert loader.worker_pids() == pids  # not restarted at an epoch's edge
    assert gone(pids)


def test_workers_end_when_the_run_succeeds():
    watch = Watcher()
    result = run(tiny(**RAW, steps=4, toggles={"dataloader_num_workers": 2}), on_step=watch)
    assert result.status == "ok" and len(watch.seen) == 2
    assert gone(watch.seen)


def test_workers_end_when_a_step_fails(monkeypatch):
    import scalekit.training.build as training

    step = training.train_step
    calls = {"n": 0}

    def failing_step(ctx, batch):
        calls["n"] += 1
        if calls["n"] == 4:
            raise RuntimeError("a step failed")
        return step(ctx, batch)

    monkeypatch.setattr(training, "train_step", failing_step)
    watch = Watcher()
    result = run(tiny(**RAW, steps=10, log_every=1, toggles={"dataloader_num_workers": 2}), on_step=watch,
                 catch_errors=True)
    assert result.status == "failed" and "a step failed" in result.error and len(watch.seen) == 2
    assert gone(watch.seen)


def test_a_transform_that_fails_in_a_worker_fails_the_run_with_its_message(monkeypatch):
    import scalekit.data.raw as raw

    def broken(ids, draw, *args):
        if draw >= 40:
            raise ValueError(f"sample {draw} cannot be transformed")
        return ids

    monkeypatch.setattr(raw, "noise_sample", broken)  # inherited by the forked workers
    watch = Watcher()
    result = run(tiny(**RAW, steps=20, log_every=1, toggles={"dataloader_num_workers": 2}), on_step=watch,
                 catch_errors=True)
    assert result.status == "failed" and "cannot be transformed" in result.error
    assert result.steps  # what was measured before it is kept
    assert gone(watch.seen)


def test_a_killed_worker_fails_the_run_in_plain_words_and_the_others_end():
    def kill_one(watch):
        os.kill(min(watch.seen), signal.SIGKILL)

    watch = Watcher(at_step=2, action=kill_one)
    result = run(tiny(**RAW, steps=200, log_every=1, toggles={"dataloader_num_workers": 2}), on_step=watch,
                 catch_errors=True)
    assert result.status == "failed" and result.error.startswith("a data-loader worker process died"), result.error
    assert gone(watch.seen)


def test_stop_in_the_lab_ends_the_workers():
    pytest.importorskip("ipywidgets")
    from scalekit import Lab

    lab = Lab(preset="tiny", steps=100_000, device="cpu", hw=CPU, warmup_steps=1, log_every=1, **RAW)
    lab.set(dataloader_num_workers=2)
    lab.run_button.click()
    deadline = time.monotonic() + 60
    while lab._steps_seen < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    seen = children()
    assert len(seen) == 2 and lab.running
    lab.stop_button.click()
    assert lab.wait(30).status == "stopped"
    assert gone(seen)


CTRL_C_SCRIPT = textwrap.dedent("""
    import sys, psutil
    from scalekit import RunConfig, run

    def on_step(record):
        if record.step == 3:
            print("WORKERS", *[p.pid for p in psutil.Process().children()], flush=True)
    cfg = RunConfig(preset="tiny", device="cpu", data="shakespeare-raw", transform_rounds=1, steps=100000,
                    warmup_steps=1, log_every=1, toggles={"dataloader_num_workers": 2})
    result = run(cfg, on_step=on_step)
    print("STATUS", result.status, len(psutil.Process().children()), flush=True)
""")


def test_ctrl_c_in_a_notebook_stops_the_run_keeps_its_steps_and_ends_the_workers():
    # a kernel interrupt: KeyboardInterrupt in the run's process (and SIGINT to its process group)
    proc = started([sys.executable, "-c", CTRL_C_SCRIPT])
    try:
        line = proc.stdout.readline()
        assert line.startswith("WORKERS"), line
        workers = [int(p) for p in line.split()[1:]]
        assert len(workers) == 2
        out, err = interrupted(proc)
    finally:
        ended(proc)
    assert proc.returncode == 0 and "STATUS stopped 0" in out, out + err
    assert gone(workers)


def test_ctrl_c_in_a_terminal_stops_a_data_bound_run_cleanly_and_ends_the_workers():
    # `scalekit bench` finishes the step it is in when Ctrl-C reaches its process group; the run waits for
    # data, so that step needs a batch a worker is making: a worker killed by the same Ctrl-C would fail it
    cmd = [sys.executable, "-m", "scalekit.cli.main", "bench", "--preset", "tiny", "--device", "cpu", "--data",
           "shakespeare-raw", "--transform-rounds", "400", "--steps", "100000", "--warmup-steps", "1",
           "--log-every", "1", "--toggle", "dataloader_num_workers=2"]
    proc = started(cmd)
    try:
        for line in proc.stderr:
            if "measuring" in line:
                break
        time.sleep(0.5)
        workers = [p.pid for p in psutil.Process(proc.pid).children()]
        assert len(workers) == 2
        out, err = interrupted(proc)
    finally:
        ended(proc)
    assert proc.returncode == 130 and "stopped" in out and "exited unexpectedly" not in out + err, out + err
    assert err.count("stopping after this step") == 1  # said by the run; the workers ignored the Ctrl-C
    assert gone(workers)


def test_a_ctrl_c_that_reaches_only_the_workers_does_not_end_them():
    # the Lab runs in a thread: a kernel interrupt reaches the workers (the process group) but not the run,
    # which must go on (Stop is the Lab's way to end it)
    def interrupt_workers(watch):
        for pid in watch.seen:
            os.kill(pid, signal.SIGINT)

    watch = Watcher(at_step=2, action=interrupt_workers)
    result = run(tiny(**RAW, steps=30, log_every=1, toggles={"dataloader_num_workers": 2}), on_step=watch,
                 catch_errors=True)
    assert result.status == "ok", result.error
    assert gone(watch.seen)


def test_workers_of_a_killed_run_exit_by_themselves():
    # SIGKILL leaves no chance to clean up: each worker sees its parent gone and exits
    proc = started([sys.executable, "-c", CTRL_C_SCRIPT])
    try:
        line = proc.stdout.readline()
        workers = [int(p) for p in line.split()[1:]]
        proc.kill()
        proc.wait(10)
        assert len(workers) == 2 and gone(workers, within_s=30)
    finally:
        ended(proc)
        for p in workers if "workers" in locals() else []:
            if psutil.pid_exists(p):
                os.kill(p, signal.SIGKILL)


FORK_AFTER_THREADS = textwrap.dedent("""
    import itertools, torch
    from scalekit import RunConfig
    from scalekit.machine.hardware import detect
    from scalekit.training.build import build
    import contextlib
    torch.set_num_threads(2)
    a = torch.randn(1024, 1024)
    (a @ a).sum().item()  # the parent runs an OpenMP parallel region before the workers are forked
    cfg = RunConfig(preset="tiny", device="cpu", data="shakespeare-raw", transform_rounds=4, batch_size=256,
                    seq_len=512, toggles={"dataloader_num_workers": 2, "vectorized_transforms": True})
    hw = detect("cpu")
    with contextlib.ExitStack() as stack:
        ctx = build(cfg.resolve(hw), hw, stack)
        for x, y in itertools.islice(ctx.batches, 4):  # the workers run tensor ops on large batches
            assert x.shape == (256, 512)
    print("DONE", flush=True)
""")


def test_workers_forked_after_torch_ran_threads_do_not_hang():
    out = subprocess.run([sys.executable, "-c", FORK_AFTER_THREADS], capture_output=True, text=True, timeout=90,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.returncode == 0 and "DONE" in out.stdout, out.stderr[-2000:]


@pytest.mark.parametrize("value", [0, -1, "two", 2.5])
def test_a_bad_worker_count_is_refused_naming_the_field(value):
    with pytest.raises(ConfigError, match=r"RunConfig.toggles\['dataloader_num_workers'\]"):
        RunConfig(toggles={"dataloader_num_workers": value})


def test_workers_say_when_they_change_nothing():
    result = run(tiny(data="synthetic", steps=2, toggles={"dataloader_num_workers": 2}, measure_memory=False))
    assert any("changes nothing for synthetic" in note for note in result.notes)
