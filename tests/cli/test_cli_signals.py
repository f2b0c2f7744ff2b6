"""Ctrl-C, SIGTERM (a scheduler's preemption, `timeout`) and SIGHUP (a closed terminal) end a command the same
way: what was measured is kept, --json is written, one line says it, and the exit code is 128 + the signal, as
a shell reports a command a signal ended.  Each test runs `scalekit` in a process of its own and signals it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.helpers import REPO, scalekit_env

TINY = ["--preset", "tiny", "--device", "cpu", "--warmup-steps", "1", "--log-every", "1"]


def signalled(argv: list[str], when: str, signum: int, within_s: float = 120) -> tuple[int, str, str]:
    """`scalekit ARGV` sent `signum` once a line holding `when` is on its standard error: (exit code, stdout,
    stderr)."""
    proc = subprocess.Popen([sys.executable, "-m", "scalekit.cli.main", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=scalekit_env(), cwd=REPO, start_new_session=True)
    seen = []
    try:
        for line in proc.stderr:
            seen.append(line)
            if when in line:
                os.kill(proc.pid, signum)
                break
        out, err = proc.communicate(timeout=within_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = "".join(seen) + err
    assert any(when in line for line in seen), err  # signalled while it worked, not after it ended
    return proc.returncode, out, err


def said_once(err: str, words: str) -> None:
    lines = [line for line in err.splitlines() if words in line]
    assert len(lines) == 1 and "Traceback" not in err, err


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_termination_signal_stops_a_bench_keeping_its_steps(signum, tmp_path):
    path = tmp_path / "r.json"
    code, out, err = signalled(["bench", *TINY, "--steps", "100000", "--json", str(path)], "measuring", signum)
    assert code == 128 + signum, err
    said_once(err, signum.name)
    result = json.loads(path.read_text())
    assert result["status"] == "stopped", result["notes"]
    assert "baseline" in out  # the table of what was measured, as after Ctrl-C


def test_sigterm_stops_a_ladder_keeping_the_rows_measured(tmp_path):
    path = tmp_path / "rows.json"
    argv = ["ladder", *TINY, "--steps", "40", "--repeats", "1", "--json", str(path)]
    code, out, err = signalled(argv, "done: baseline (ok)", signal.SIGTERM)
    assert code == 143, err
    said_once(err, "SIGTERM")
    rows = json.loads(path.read_text())
    assert rows[0]["label"] == "baseline" and rows[0]["status"] == "ok"
    # the rung under way when it came stops, and none above it is climbed
    assert all(r["status"] in ("stopped", "skipped") for r in rows[1:]), [r["status"] for r in rows]
    assert "baseline" in out


@pytest.mark.parametrize("argv,when", [
    (["ladder", *TINY, "--steps", "100000", "--repeats", "1"], "measuring"),
    (["tune", *TINY, "--steps", "3", "--time-budget-s", "60"], "·"),
    (["generate", "--device", "cpu", "--max-new-tokens", "200", "--no-quality"], "warm-up"),
], ids=["ladder", "tune", "generate"])
def test_ctrl_c_ends_every_command_with_130_and_its_json_written(argv, when, tmp_path):
    path = tmp_path / "r.json"
    code, _, err = signalled([*argv, "--json", str(path)], when, signal.SIGINT)
    assert code == 130, err
    assert "Traceback" not in err and json.loads(path.read_text()), err


def test_ctrl_c_stops_doctor_at_once_with_one_line():
    code, out, err = signalled(["doctor"], "checking torch.compile", signal.SIGINT)
    assert code == 130, err
    said_once(err, "interrupted")
    assert out == "", out  # no report after it was told to stop


class StopAfter:
    """A `stop` that is set from its n-th question on (run() asks once before it builds, then once per step)."""

    def __init__(self, unset_answers: int):
        self.left = unset_answers

    def is_set(self) -> bool:
        self.left -= 1
        return self.left < 0


@pytest.mark.parametrize("unset_answers", [1, 2], ids=["before-the-first-step", "after-the-warm-up"])
def test_a_row_stopped_before_its_first_measured_step_says_so(unset_answers):
    from scalekit import RunConfig, run
    from scalekit.training.report import results_table

    result = run(RunConfig(preset="tiny", device="cpu", steps=3, warmup_steps=1, measure_memory=False),
                 stop=StopAfter(unset_answers))
    assert result.status == "stopped" and not result.finished
    table = results_table([result])
    assert "stopped (Ctrl-C, Stop or a termination signal) before its first measured step: nothing measured" \
        in table, table
    assert "stopped: stopped" not in table, table
