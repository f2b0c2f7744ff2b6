"""The scalekit command: bench, ladder, doctor, and errors in words."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from scalekit.cli.main import main


def test_bench_prints_a_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "r.json"
    code = main(["bench", "--preset", "tiny", "--steps", "4", "--warmup-steps", "1", "--toggle", "bf16",
                 "--toggle", "fused_adamw", "--json", str(out)])
    assert code == 0
    printed = capsys.readouterr()
    assert "bf16 + fused_adamw" in printed.out and "tokens/s" in printed.out
    assert "measuring 4 steps" in printed.err  # progress is visible
    data = json.loads(out.read_text())
    assert data["config"]["toggles"] == {"fused_adamw": True, "bf16": True}
    assert len([s for s in data["steps"] if not s["warmup"]]) == 4



def test_the_program_exits_with_mains_code_and_still_runs_what_an_exit_must(tmp_path):
    """program() freezes the collector before the interpreter's last passes; the exit's duties stay: atexit
    handlers and weakref finalizers run, files written are whole, the exit code is main's."""
    script = f"""
import atexit, gc, sys, tempfile, weakref
from pathlib import Path
from scalekit.cli.main import program

folder = tempfile.TemporaryDirectory(dir={str(tmp_path)!r})  # removed by its weakref finalizer at exit
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0, flush=True))
sys.argv = ["scalekit", *sys.argv[1:]]
sys.exit(program())
"""
    out = tmp_path / "bench.json"
    ok = subprocess.run([sys.executable, "-c", script, "bench", "--preset", "tiny", "--device", "cpu", "--steps", "2",
                         "--warmup-steps", "0", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "frozen at exit: True" in ok.stdout
    assert json.loads(out.read_text())["status"] == "ok"  # the file is whole
    assert [p.name for p in tmp_path.iterdir()] == ["bench.json"]  # the temporary folder went at exit
    refused = subprocess.run([sys.executable, "-c", script, "bench", "--preset", "huge"], capture_output=True,
                             text=True, timeout=300)
    assert refused.returncode == 2 and "unknown preset 'huge'" in refused.stderr


@pytest.mark.parametrize("argv,words", [
    (["bench", "--batch-size", "-1"], "RunConfig.batch_size must be a positive integer"),
    (["bench", "--toggle", "nope"], "unknown toggle 'nope'; allowed:"),
    (["bench", "--preset", "huge"], "unknown preset 'huge'; allowed: auto, tiny"),
    (["bench", "--toggle", "tf32", "--device", "cpu"], "'tf32' is unavailable on this machine"),
])
def test_bad_input_exits_2_with_a_message_not_a_traceback(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_the_parser_is_built_once_per_set_of_toggles_and_keeps_nothing_between_parses():
    from scalekit.cli.parser import parser
    from scalekit.toggles import Toggle, register, unregister

    first = parser()
    assert parser() is first  # built once
    with_two = first.parse_args(["bench", "--toggle", "bf16", "--toggle", "sdpa"])
    assert with_two.toggle == [("bf16", True), ("sdpa", True)]
    assert first.parse_args(["bench"]).toggle == []  # the appended flags of the last parse are not left behind
    assert first.parse_args(["bench", "--steps", "7"]).steps == 7 and first.parse_args(["bench"]).steps == 20

    class Probe(Toggle):
        name, summary, cost, helps_when, group, phase = "parser_probe", "a probe", "none", "never", "memory", "step"
        loops = ("train",)

        def apply(self, ctx, value):
            pass

    register(Probe())
    try:
        rebuilt = parser()
        assert rebuilt is not first and "parser_probe" in rebuilt.format_help() + _toggles_help(rebuilt)
    finally:
        unregister("parser_probe")
    assert parser() is first and "parser_probe" not in _toggles_help(parser())


def _toggles_help(p) -> str:
    import argparse

    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["toggles"].format_help()


@pytest.mark.slow
def test_ladder_end_to_end_in_a_fresh_process(tmp_path):
    out = tmp_path / "ladder.json"
    proc = subprocess.run([sys.executable, "-m", "scalekit.cli.main", "ladder", "--steps", "4", "--warmup-steps", "1",
                           "--device", "cpu", "--repeats", "1", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert [r["label"] for r in rows] == ["baseline", "+ tf32", "+ bf16", "+ compile", "+ sdpa", "+ nice_numbers",
                                          "+ fused_adamw"]
    assert rows[1]["status"] == "skipped" and "CPU" in rows[1]["error"]
    assert all(r["status"] == "ok" for r in rows if r["label"] != "+ tf32")
    # cumulative: each rung keeps the ones below it
    assert rows[-1]["config"]["toggles"] == {"sdpa": True, "nice_numbers": True, "compile": "default",
                                             "fused_adamw": True, "bf16": True}
    for word in ("step ms", "speed-up", "MFU", "compile", "skipped"):
        assert word in proc.stdout


def test_doctor_reports_the_facts(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    for word in ("device", "bf16", "tf32", "peak bf16 (for MFU)", "torch.compile", "C++ compiler", "bitsandbytes",
                 "toggle tf32", "unavailable:"):
        assert word in out


def test_a_mesh_the_ranks_cannot_form_is_refused_before_any_rank_starts(monkeypatch, capsys):
    import time

    import scalekit.launch.api as launch_api

    started = []
    monkeypatch.setattr(launch_api, "launch", lambda *args, **kwargs: started.append(args))
    t0 = time.monotonic()
    code = main(["bench", "--preset", "tiny", "--device", "cpu", "--nproc-per-node", "2", "--toggle", "fsdp",
                 "--toggle", "tensor_parallel=4"])
    took_s = time.monotonic() - t0
    err = capsys.readouterr().err
    assert code == 2 and not started, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("scalekit: error:") and "tensor_parallel degree 4 does not divide 2 ranks" in lines[0]
    assert took_s < 5, took_s  # a check, not a launch (ranks take seconds to start)


def test_launch_run_refuses_such_a_mesh_from_python_before_any_rank_starts(monkeypatch):
    import scalekit.launch.api as launch_api
    from scalekit import RunConfig
    from scalekit.errors import ConfigError

    started = []
    monkeypatch.setattr(launch_api, "launch", lambda *args, **kwargs: started.append(args))
    cfg = RunConfig(preset="tiny", device="cpu", toggles={"fsdp": True, "tensor_parallel": 4})
    with pytest.raises(ConfigError, match="tensor_parallel degree 4 does not divide 2 ranks"):
        launch_api.launch_run(cfg, nprocs=2, catch_errors=True)
    assert not started
