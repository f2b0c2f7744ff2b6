"""Fault injection for scalekit.launch: a rank that dies, hangs or is interrupted, and bad arguments.

Every test here must leave no child process (the no_process_left_behind fixture) and no run folder in a
temp folder of its own (the fresh_tmp fixture).  In tests/launch/: the suite runs it before
anything imports bitsandbytes (conftest).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import gc
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import torch
import torch.distributed as dist

import scalekit
from scalekit.cli.main import main
from scalekit.errors import ConfigError
from scalekit.launch import LaunchError, launch, launch_run, launch_script
from scalekit.launch.run_files import LOCK_NAME, remove_stale_folders, run_folder
from scalekit.launch.signals import Signals
from tests.forking import no_process_left_behind  # noqa: F401 - deadline and cleanup
from tests.helpers import Regressor, mse_loss, regression_batch, tiny

HANG_LIMIT_S = 3  # the time limit the hang tests set; they must end within HANG_LIMIT_S + SLACK_S
SLACK_S = 15  # generous: two shared cores


@pytest.fixture(autouse=True)
def fresh_tmp(tmp_path, monkeypatch):
    """Point the temp folder (this process's and the ranks') at an empty one; after the test it must hold no
    run folder of a launch, and none of torch.multiprocessing's error files."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    yield tmp
    left = sorted(p.name for p in tmp.iterdir() if p.name.startswith(("scalekit-launch-", "pytorch-errorfile-")))
    assert not left, f"left in the temp folder: {left}"


def _first_line(exc) -> str:
    return str(exc).splitlines()[0]


# -- the first failure leads the report ----------------------------------------------------------------------
def _exits_while_rank_0_waits(how):
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        time.sleep(0.3)  # rank 0 is in the all_reduce by now
        if how == "exit":
            os._exit(3)
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise ValueError("rank one broke")
    t = torch.ones(1)
    dist.all_reduce(t)  # fails on the closed connection once rank 1 has gone
    time.sleep(60)


@pytest.mark.parametrize("attempt", range(3))  # the order in which torch notices the two failures varies
def test_a_rank_that_exits_leads_the_report_not_the_connection_error_it_causes(attempt):
    with pytest.raises(LaunchError) as info:
        launch(_exits_while_rank_0_waits, "exit", nprocs=2)
    text = str(info.value)
    assert info.value.rank == 1
    assert text.startswith("rank 1 ended with exit code 3 and no Python exception"), text
    if "rank 0" in text:  # rank 0's error follows, as a consequence, or it was stopped before it raised
        after = text[text.index("After it:"):]
        assert "rank 0 was stopped by the launcher" in after or "most likely a consequence" in after, text


def test_a_rank_killed_by_a_signal_is_named_with_the_signal():
    with pytest.raises(LaunchError) as info:
        launch(_exits_while_rank_0_waits, "kill", nprocs=2)
    assert info.value.rank == 1
    assert _first_line(info.value).startswith("rank 1 ended with signal SIGKILL"), str(info.value)


def test_a_python_exception_leads_with_its_traceback_and_the_waiting_rank_follows():
    with pytest.raises(LaunchError) as info:
        launch(_exits_while_rank_0_waits, "raise", nprocs=2)
    assert info.value.rank == 1
    assert _first_line(info.value) == "rank 1 failed: ValueError: rank one broke"
    assert "raise ValueError" in info.value.rank_traceback
    text = str(info.value)
    assert "Connection" not in text.split("After it:")[0]  # rank 0's connection error is not the headline


EXITS_WHILE_RANK_0_WAITS = textwrap.dedent("""
    import os, time, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        time.sleep(0.3)
        os._exit(3)
    t = torch.ones(1); dist.all_reduce(t)
    time.sleep(60)
""")


def test_a_script_rank_that_exits_leads_the_report(tmp_path):
    script = tmp_path / "exits.py"
    script.write_text(EXITS_WHILE_RANK_0_WAITS)
    with pytest.raises(LaunchError) as info:
        launch_script(str(script), nprocs=2)
    assert info.value.rank == 1
    assert _first_line(info.value).startswith("rank 1 ended with exit code 3"), str(info.value)


# -- what a forked rank inherits ------------------------------------------------------------------------------
class _Cycle:
    """An object in a reference cycle: garbage that only the cyclic collector frees."""

    def __init__(self, **things):
        self.__dict__.update(things, cycle=self)


def _collects_garbage():
    gc.collect()  # any rank that allocates enough gets here sooner or later
    return "ok"


def test_garbage_with_threads_left_by_an_earlier_launch_does_not_crash_the_next_ranks():
    """A caught LaunchError's traceback keeps the finished launch's agent and store in a cycle; a rank whose
    garbage collector finalized its inherited copy joined threads the fork had not copied: SIGSEGV."""
    import datetime

    store = dist.HashStore()
    garbage = _Cycle(server=dist.TCPStore("127.0.0.1", 0, 1, True),
                     group=dist.ProcessGroupGloo(store, 0, 1, datetime.timedelta(seconds=30)))
    garbage.group.allreduce([torch.ones(1)]).wait()  # its worker threads are running
    del garbage, store
    for _ in range(2):
        assert launch(_collects_garbage, nprocs=2) == ["ok", "ok"]
    gc.collect()  # and this process frees it, where its threads are


# -- time limits ------------------------------------------------------------------------------------------
def _hangs(in_collective: bool):
    dist.init_process_group("gloo")
    # both ranks connected before either goes its way: a rank 0 that finished while rank 1 was still connecting
    # would make rank 1 fail ("connection closed by peer") instead of hang
    dist.barrier()
    if dist.get_rank() == 1:
        time.sleep(600)  # hangs
    if in_collective:
        t = torch.ones(1)
        dist.all_reduce(t)  # waits for rank 1 for ever
    return "done"


@pytest.mark.parametrize("in_collective", [True, False], ids=["rank-0-in-all_reduce", "rank-0-finished"])
def test_a_hanging_rank_is_stopped_at_the_time_limit_and_named(in_collective):
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(_hangs, in_collective, nprocs=2, timeout_s=HANG_LIMIT_S)
    elapsed_s = time.monotonic() - t0
    assert HANG_LIMIT_S <= elapsed_s < HANG_LIMIT_S + SLACK_S
    text = str(info.value)
    assert info.value.timed_out and info.value.rank is None
    assert text.startswith(f"the launch reached its time limit of {HANG_LIMIT_S} s (timeout_s)"), text
    assert "rank 1 was in _hangs (" in text  # where it was, from its own stack
    if in_collective:
        assert info.value.still_running == [0, 1]
        assert "ranks 0 and 1 were still running" in text
        assert "rank 0 was in all_reduce" in text and "called from _hangs" in text
    else:
        assert info.value.still_running == [1]
        assert "rank 1 was still running" in text and "rank 0 had finished" in text


def _timeout_given_to_the_process_group():
    """What distributed.setup() passes to init_process_group in a launched rank."""
    from contextlib import ExitStack

    from scalekit.distributed import runtime as distributed

    seen = {}
    real = dist.init_process_group

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    dist.init_process_group = spy
    with ExitStack() as stack:
        distributed.setup(scalekit.detect("cpu"), stack, batch_size=2)
        t = torch.ones(1)
        dist.all_reduce(t)
    return seen.get("timeout")


def test_the_process_group_timeout_matches_the_launch_limit_and_is_torchs_default_without_one():
    import datetime

    assert launch(_timeout_given_to_the_process_group, nprocs=2, timeout_s=42) == [datetime.timedelta(seconds=42)] * 2
    assert launch(_timeout_given_to_the_process_group, nprocs=2) == [None, None]  # torch's own default


def _hanging_loss(model, batch):
    if dist.get_rank() == 1:
        time.sleep(600)
    return mse_loss(model, batch)


def test_launch_run_with_a_time_limit_comes_back_as_a_failed_result_naming_the_ranks():
    # imported here, the forked ranks inherit it: the time limit then finds rank 1 in its hang rather than in
    # this import of a DDP run's, seconds long on a busy machine
    import torch._dynamo  # noqa: F401

    cfg = tiny(model=Regressor, batch_fn=regression_batch, loss_fn=_hanging_loss, toggles=["ddp"], batch_size=8)
    t0 = time.monotonic()
    result = launch_run(cfg, nprocs=2, timeout_s=HANG_LIMIT_S, catch_errors=True)
    assert time.monotonic() - t0 < HANG_LIMIT_S + SLACK_S
    assert result.status == "failed"
    assert result.error.startswith(f"the launch reached its time limit of {HANG_LIMIT_S} s"), result.error
    assert "still running" in result.error and "rank 1 was in _hanging_loss" in result.error
    with pytest.raises(LaunchError, match="time limit"):
        launch_run(cfg, nprocs=2, timeout_s=HANG_LIMIT_S)


HANGS = textwrap.dedent("""
    import time, torch.distributed as dist
    dist.init_process_group("gloo")
    print("rank", dist.get_rank(), "started", flush=True)
    time.sleep(600)
""")


def test_cli_launch_timeout_stops_the_script_and_names_the_ranks(tmp_path, capsys):
    script = tmp_path / "hangs.py"
    script.write_text(HANGS)
    t0 = time.monotonic()
    assert main(["launch", "--nproc-per-node", "2", "--timeout-s", str(HANG_LIMIT_S), str(script)]) == 1
    assert time.monotonic() - t0 < HANG_LIMIT_S + SLACK_S
    err = capsys.readouterr().err
    assert (f"scalekit launch: the launch reached its time limit of {HANG_LIMIT_S} s (timeout_s): ranks 0 and 1 "
            f"were still running") in err, err


# -- run folders: removed, or kept on request ---------------------------------------------------------------
def _hello():
    return dist.get_rank() if dist.is_initialized() else int(os.environ["RANK"])


def _fails():
    raise RuntimeError("broken on purpose")


def test_keep_logs_keeps_the_folder_and_prints_its_path(fresh_tmp, capsys):
    assert launch(_hello, nprocs=2, keep_logs=True) == [0, 1]
    kept = list(fresh_tmp.glob("scalekit-launch-*"))
    assert len(kept) == 1 and f"the ranks' logs are kept in {kept[0]}" in capsys.readouterr().err
    with pytest.raises(LaunchError) as info:
        launch(_fails, nprocs=2, keep_logs=True)
    assert info.value.logs_dir and f"Logs: {info.value.logs_dir}" in str(info.value)
    assert "broken on purpose" in Path(info.value.logs_dir, "rank0.err").read_text()
    for path in fresh_tmp.glob("scalekit-launch-*"):
        shutil.rmtree(path)  # kept on purpose: the fixture checks the rest


def test_cli_keep_logs(tmp_path, fresh_tmp, capsys):
    script = tmp_path / "ok.py"
    script.write_text("print('fine')\n")
    assert main(["launch", "--nproc-per-node", "2", "--keep-logs", str(script)]) == 0
    kept = list(fresh_tmp.glob("scalekit-launch-*"))
    assert len(kept) == 1 and str(kept[0]) in capsys.readouterr().err
    assert (kept[0] / "rank1.out").read_text() == "fine\n"
    shutil.rmtree(kept[0])


# -- Ctrl-C ---------------------------------------------------------------------------------------------------
def _sleeps(ready_dir):
    Path(ready_dir, f"ready{os.environ['RANK']}").touch()
    time.sleep(60)


def _interrupt_when_ready(ready_dir: Path, presses: int, nprocs: int = 2) -> threading.Thread:
    """SIGINT to this process, as Ctrl-C would, once every rank is running (a second press comes while the
    launcher is stopping the ranks)."""
    def go():
        deadline = time.monotonic() + 30
        while len(list(ready_dir.glob("ready*"))) < nprocs and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        for _ in range(presses):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.02)

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_stops_every_rank_and_raises_keyboard_interrupt_with_one_line(presses, tmp_path, capsys):
    thread = _interrupt_when_ready(tmp_path, presses)
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt) as info:
        launch(_sleeps, str(tmp_path), nprocs=2)
    thread.join()
    assert str(info.value) == "launch interrupted: every rank was stopped"
    assert time.monotonic() - t0 < 30
    assert psutil.Process().children(recursive=True) == []
    assert "Traceback" not in capsys.readouterr().err  # no rank printed a KeyboardInterrupt of its own
    assert launch(_hello, nprocs=2) == [0, 1]  # and the next launch works


def _wait_for(predicate, timeout_s: float = 60) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def _ctrl_c_to_a_cli(argv, ready, fresh_tmp, signum=signal.SIGINT) -> subprocess.CompletedProcess:
    """Run `scalekit ARGV` in a terminal-like process group, press Ctrl-C once `ready(proc)` holds (or send
    another signal to the command alone, as `kill` or a scheduler does)."""
    env = dict(os.environ, TMPDIR=str(fresh_tmp))
    proc = subprocess.Popen([sys.executable, "-m", "scalekit.cli.main", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        assert _wait_for(lambda: ready(proc)), "the ranks did not start"
        time.sleep(0.5)
        if signum == signal.SIGINT:
            os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole foreground group
        else:
            os.kill(proc.pid, signum)
        out, err = proc.communicate(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _ranks_of(proc) -> list:
    with contextlib.suppress(psutil.Error):
        return psutil.Process(proc.pid).children()
    return []


def test_ctrl_c_to_scalekit_launch_prints_one_line_and_exits_130(tmp_path, fresh_tmp):
    script = tmp_path / "hangs.py"
    script.write_text(HANGS)
    done = _ctrl_c_to_a_cli(["launch", "--nproc-per-node", "2", str(script)],
                            lambda proc: len(_ranks_of(proc)) == 2 and len(list(fresh_tmp.glob("*/rank*.out"))) == 2
                            and all(p.read_text() for p in fresh_tmp.glob("*/rank*.out")), fresh_tmp)
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "scalekit launch: interrupted; every rank was stopped"
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr, done.stderr
    assert not any(str(script) in " ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"]))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_to_scalekit_bench_with_ranks_prints_one_line_and_exits_128_plus_it(signum, fresh_tmp):
    argv = ["bench", "--preset", "tiny", "--device", "cpu", "--data", "synthetic", "--steps", "100000",
            "--toggle", "ddp", "--nproc-per-node", "2"]
    pids = []

    def ready(proc):
        ranks = _ranks_of(proc)
        pids[:] = [p.pid for p in ranks]
        return len(ranks) == 2 and any(fresh_tmp.glob("scalekit-launch-*"))

    done = _ctrl_c_to_a_cli(argv, ready, fresh_tmp, signum)
    assert done.returncode == 128 + signum, done.stderr
    said = "interrupted" if signum == signal.SIGINT else "stopped by SIGTERM"
    assert done.stderr.strip().splitlines()[-1] == f"scalekit bench: {said}; every rank was stopped"
    assert "Traceback" not in done.stderr and "SignalException" not in done.stderr, done.stderr
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)


# -- arguments that are not a number of ranks or seconds -------------------------------------------------------
@pytest.mark.parametrize("argv,flag", [
    (["launch", "--nproc-per-node", "0", "x.py"], "--nproc-per-node"),
    (["launch", "--nproc-per-node", "-1", "x.py"], "--nproc-per-node"),
    (["launch", "--timeout-s", "0", "x.py"], "--timeout-s"),
    (["launch", "--timeout-s", "-5", "x.py"], "--timeout-s"),
    (["launch", "--timeout-s", "nan", "x.py"], "--timeout-s"),
    (["bench", "--nproc-per-node", "0"], "--nproc-per-node"),
    (["bench", "--nproc-per-node", "-2"], "--nproc-per-node"),
    (["bench", "--nproc-per-node", "2", "--timeout-s", "0"], "--timeout-s"),
    (["bench", "--timeout-s", "5"], "--timeout-s"),  # no processes to limit
], ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_bad_counts_and_limits_on_the_command_line_are_one_line_errors(argv, flag, capsys):
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"scalekit: error: {flag} "), captured.err
    assert "positive" in lines[0] or "--nproc-per-node N" in lines[0]
    assert "[rank" not in captured.out + captured.err  # nothing was started


@pytest.mark.parametrize("timeout_s", [0, -1, math.nan, math.inf, True, "3"])
def test_a_bad_timeout_is_a_config_error_naming_the_argument(timeout_s):
    for call in (lambda: launch(_hello, nprocs=2, timeout_s=timeout_s),
                 lambda: launch_run(tiny(), nprocs=2, timeout_s=timeout_s, catch_errors=True),
                 lambda: launch_script("x.py", nprocs=2, timeout_s=timeout_s)):
        with pytest.raises(ConfigError, match=r"launch\(timeout_s=\.\.\.\) must be a positive number of seconds"):
            call()


@pytest.mark.parametrize("nprocs", [0, -3])
def test_a_bad_nprocs_names_the_argument_and_the_allowed_values(nprocs):
    with pytest.raises(ConfigError, match=r"launch\(nprocs=\.\.\.\) must be a positive integer \(the number of "
                                          r"ranks: 1, 2, \.\.\.\)"):
        launch(_hello, nprocs=nprocs)


# -- a launcher killed outright (SIGKILL, the OOM killer) -------------------------------------------------------
RANKS_END_S = 5  # after their launcher is killed, its ranks must be gone within this

SLEEPS_UNDER_A_LAUNCHER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    import scalekit
    import scalekit.launch.rank as rank_module

    def sleeps(ready_dir):
        Path(ready_dir, str(os.getpid())).touch()
        time.sleep(60)

    if __name__ == "__main__":
        if sys.argv[2] == "watcher":  # as where prctl is missing: a thread in each rank looks for its launcher
            rank_module.set_parent_death_signal = lambda signum: False
        scalekit.launch(sleeps, sys.argv[1], nprocs=2)
""")


def _alive(pid: int) -> bool:
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    return False


def _kill_launcher_when_ranks_are_up(argv, rank_pids, fresh_tmp, tmp_path) -> list[int]:
    """Start `argv` in a session of its own; once rank_pids() names 2 ranks, SIGKILL the launcher alone; return
    the ranks' pids once they are all gone (the test fails if they outlive RANKS_END_S)."""
    env = dict(os.environ, TMPDIR=str(fresh_tmp))
    with open(tmp_path / "launcher.err", "w") as err:
        launcher = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        started = _wait_for(lambda: len(rank_pids(launcher)) == 2 or launcher.poll() is not None)
        pids = rank_pids(launcher)
        assert started and len(pids) == 2, (tmp_path / "launcher.err").read_text()
        launcher.kill()  # SIGKILL: no handler, no finally, no cleanup runs in the launcher
        launcher.wait()
        assert _wait_for(lambda: not any(map(_alive, pids)), RANKS_END_S), (
            f"ranks {[p for p in pids if _alive(p)]} outlived their launcher by {RANKS_END_S} s")
        return pids
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)  # the launcher's session: its ranks too, were any left


@pytest.mark.parametrize("how", ["prctl", "watcher"])
def test_a_killed_launchers_ranks_end_within_seconds_and_the_next_launch_removes_its_folder(how, tmp_path,
                                                                                          fresh_tmp):
    script, ready = tmp_path / "sleeps.py", tmp_path / "ready"
    script.write_text(SLEEPS_UNDER_A_LAUNCHER)
    ready.mkdir()
    _kill_launcher_when_ranks_are_up([sys.executable, str(script), str(ready), how],
                                     lambda launcher: [int(p.name) for p in ready.iterdir()], fresh_tmp, tmp_path)
    stale = list(fresh_tmp.glob("scalekit-launch-*"))
    assert len(stale) == 1, stale  # the killed launcher could not remove its folder
    assert launch(_hello, nprocs=2) == [0, 1]
    assert not stale[0].exists(), "the next launch left the stale folder"


def test_a_killed_bench_launchers_ranks_end_within_seconds(tmp_path, fresh_tmp):
    argv = [sys.executable, "-m", "scalekit.cli.main", "bench", "--preset", "tiny", "--device", "cpu", "--data",
            "synthetic", "--steps", "100000", "--toggle", "ddp", "--nproc-per-node", "2"]
    _kill_launcher_when_ranks_are_up(argv, lambda launcher: [p.pid for p in _ranks_of(launcher)], fresh_tmp,
                                     tmp_path)
    remove_stale_folders(fresh_tmp)  # for the fixture: what the next launch would do


SLEEPING_SCRIPT = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path

    assert __name__ == "__main__" and sys.argv[0].endswith("sleeping_rank.py"), (__name__, sys.argv)
    Path(sys.argv[1], str(os.getpid())).touch()  # its own arguments, as `python sleeping_rank.py READY` gives them
    time.sleep(60)
""")


def test_a_killed_script_launchers_ranks_end_within_seconds(tmp_path, fresh_tmp):
    """`scalekit launch` starts fresh interpreters for a script: each is bound to the launcher before the script
    runs (scalekit.launch.script_bootstrap), and the script still sees itself as __main__ with its own argv."""
    script, ready = tmp_path / "sleeping_rank.py", tmp_path / "ready"
    script.write_text(SLEEPING_SCRIPT)
    ready.mkdir()
    argv = [sys.executable, "-m", "scalekit.cli.main", "launch", "--nproc-per-node", "2", str(script), str(ready)]
    _kill_launcher_when_ranks_are_up(argv, lambda launcher: [int(p.name) for p in ready.iterdir()], fresh_tmp,
                                     tmp_path)
    remove_stale_folders(fresh_tmp)  # for the fixture: what the next launch would do


TORCHRUN_CELL_UNDER_A_KERNEL = textwrap.dedent("""
    import sys
    from scalekit.launch.magic import run_cell

    cell = "import os, sys, time\\nfrom pathlib import Path\\nPath(%r, str(os.getpid())).touch()\\ntime.sleep(60)\\n"
    run_cell("--nproc-per-node 2", cell % sys.argv[1])
""")


def test_a_killed_kernels_torchrun_cell_ends_within_seconds(tmp_path, fresh_tmp):
    """The %%torchrun magic's torchrun is told (SIGTERM) when the kernel that started it dies outright, and stops
    its ranks: neither outlives the kernel."""
    kernel, ready = tmp_path / "kernel.py", tmp_path / "ready"
    kernel.write_text(TORCHRUN_CELL_UNDER_A_KERNEL)
    ready.mkdir()
    torchruns = []

    def ranks(launcher):
        torchruns[:] = [p.pid for p in psutil.Process(launcher.pid).children()]
        return [int(p.name) for p in ready.iterdir()]

    _kill_launcher_when_ranks_are_up([sys.executable, str(kernel), str(ready)], ranks, fresh_tmp, tmp_path)
    assert torchruns and _wait_for(lambda: not any(map(_alive, torchruns)), RANKS_END_S), "torchrun outlived it"


def test_only_folders_nothing_holds_are_stale(fresh_tmp):
    """A running launch's folder stays, and so does a kept one; a folder whose launch has ended goes."""
    with run_folder(keep_logs=False, signals=Signals()) as live, run_folder(True, Signals()) as kept:
        ended = fresh_tmp / "scalekit-launch-ended"
        ended.mkdir()
        (ended / LOCK_NAME).touch()  # its lock file, which nothing holds any more
        assert remove_stale_folders(fresh_tmp) == [ended]
        assert live.root.exists() and kept.root.exists()
    assert not live.root.exists()
    shutil.rmtree(kept.root)


def test_a_folder_whose_launcher_is_gone_but_a_rank_lives_is_not_stale(fresh_tmp):
    """A forked rank inherits its launcher's lock: while one lives, it may still write in the folder."""
    folder = fresh_tmp / "scalekit-launch-orphaned"
    folder.mkdir()
    fd = os.open(folder / LOCK_NAME, os.O_WRONLY | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    rank = subprocess.Popen(["sleep", "30"], pass_fds=(fd,))  # holds the lock once this process lets go
    os.close(fd)
    try:
        assert remove_stale_folders(fresh_tmp) == [] and folder.exists()
    finally:
        rank.kill()
        rank.wait()
    assert remove_stale_folders(fresh_tmp) == [folder] and not folder.exists()


# -- what a rank cannot send back, and a full temp folder -----------------------------------------------------
def _returns_a_lock():
    return threading.Lock()


def test_a_return_value_that_cannot_be_pickled_is_named_and_leaves_no_file(fresh_tmp):
    with pytest.raises(LaunchError) as info:
        launch(_returns_a_lock, nprocs=2)
    assert _first_line(info.value).startswith(
        "rank 0 could not send its return value back: cannot pickle '_thread.lock' object"), str(info.value)
    assert info.value.rank == 0
    # and no pytorch-errorfile-*.pickle in the temp folder: the fresh_tmp fixture checks


def _fails_to_rebuild():
    raise ValueError("cannot be rebuilt here")


class _Unreadable:
    def __reduce__(self):
        return _fails_to_rebuild, ()


def _returns_what_cannot_be_read_back():
    return _Unreadable()


def test_a_return_value_that_cannot_be_read_back_is_named():
    with pytest.raises(LaunchError) as info:
        launch(_returns_what_cannot_be_read_back, nprocs=2)
    assert str(info.value) == ("rank 0's return value could not be read back in this process: ValueError: cannot "
                               "be rebuilt here"), str(info.value)


def test_a_full_temp_folder_is_refused_in_one_sentence_before_any_rank_starts(fresh_tmp, monkeypatch):
    from scalekit.launch import run_files

    monkeypatch.setattr(run_files.shutil, "disk_usage", lambda path: SimpleNamespace(total=1 << 30, used=1 << 30,
                                                                                     free=0))
    with pytest.raises(LaunchError) as info:
        launch(_hello, nprocs=2)
    assert str(info.value).startswith(f"no space left in the temp folder {fresh_tmp} (0 bytes free)"), str(info.value)
    assert psutil.Process().children() == []


def test_a_temp_folder_that_cannot_take_the_launch_folder_is_one_sentence(fresh_tmp, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tempfile, "mkdtemp", full)
    with pytest.raises(LaunchError, match=f"^no space left in the temp folder {re.escape(str(fresh_tmp))}"):
        launch(_hello, nprocs=2)


def _fills_the_disk_and_dies():
    Path(tempfile.gettempdir(), "disk-full").touch()  # what the fake disk_usage below reads
    os._exit(1)  # as a rank whose output and record found no room: it ends with no word of why


def test_ranks_that_end_without_a_word_in_a_full_temp_folder_are_told_in_one_sentence(fresh_tmp, monkeypatch):
    from scalekit.launch import run_files

    def disk_usage(path):
        free = 0 if (fresh_tmp / "disk-full").exists() else 1 << 30
        return SimpleNamespace(total=1 << 30, used=(1 << 30) - free, free=free)

    monkeypatch.setattr(run_files.shutil, "disk_usage", disk_usage)
    with pytest.raises(LaunchError) as info:
        launch(_fills_the_disk_and_dies, nprocs=2)
    assert str(info.value).startswith(f"no space left in the temp folder {fresh_tmp} (0 bytes free)"), str(info.value)


@pytest.fixture
def small_tmpfs(tmp_path, monkeypatch):
    """A 256 KiB tmpfs as the temp folder (mounting needs root, or the capability: skipped without)."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip() or done.returncode}")
    monkeypatch.setenv("TMPDIR", str(mount))
    monkeypatch.setattr(tempfile, "tempdir", str(mount))
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def _fills_the_temp_folder_then_prints():
    with contextlib.suppress(OSError), open(Path(tempfile.gettempdir(), f"fill{os.environ['RANK']}"), "wb") as f:
        while True:
            f.write(bytes(4096))
            f.flush()
    print("nowhere to go " * 1000)  # the rank's output file cannot grow: this raises, and so does its record


def test_a_temp_folder_that_fills_while_ranks_run_is_one_sentence(small_tmpfs):
    with pytest.raises(LaunchError) as info:
        launch(_fills_the_temp_folder_then_prints, nprocs=2)
    assert str(info.value).startswith(f"no space left in the temp folder {small_tmpfs} (0 bytes free)"), (
        str(info.value))
    assert sorted(p.name for p in small_tmpfs.iterdir()) == ["fill0", "fill1"]  # no folder, no torch error file
