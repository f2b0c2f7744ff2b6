"""Fault injection: each way a run used to lose its measurements, report a wrong figure, hang or leave a
mess, reproduced, and the behaviour that replaced it checked."""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing
import os
import stat
import threading
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import scalekit
from scalekit import ConfigError, RunConfig, run
from scalekit.cli.main import main
from scalekit.data import shakespeare
from scalekit.data.loaders import FullBatches, TokenWindows
from scalekit.errors import plain_error
from scalekit.files import write_atomic
from scalekit.models import weight_files as checkpoint
from tests.helpers import CPU, Regressor, mse_loss, regression_batch, tiny

QUICK = dict(measure_memory=False, log_every=2)


# -- data edges ---------------------------------------------------------------------------------------------
def test_every_batch_is_full_across_epoch_boundaries_and_nothing_is_skipped():
    n, b = 21, 8  # two full batches and a remainder of 5 per epoch
    batches = iter(FullBatches(n, b, torch.Generator().manual_seed(0)))
    first = [next(batches) for _ in range(21)]  # 8 epochs' worth
    assert {len(x) for x in first} == {b}
    seen = [i for x in first for i in x]
    assert sorted(seen) == sorted(list(range(n)) * 8)  # every sample of every epoch, none dropped
    dropped = iter(FullBatches(n, b, torch.Generator().manual_seed(0), drop_last=True))
    epoch = [next(dropped) for _ in range(2)]
    assert {len(x) for x in epoch} == {b} and len({i for x in epoch for i in x}) == 16  # the remainder skipped


def test_a_batch_larger_than_the_corpus_spans_epochs_and_counts_its_real_tokens():
    windows = len(TokenWindows(shakespeare.load_tokens("train"), 64))
    first = next(iter(FullBatches(windows, windows + 100, torch.Generator().manual_seed(0))))
    assert len(first) == windows + 100 and len(set(first)) == windows  # every window once, 100 again
    with pytest.raises(ConfigError, match="drop_last.*no batch is left"):
        next(iter(FullBatches(windows, windows + 1, torch.Generator(), drop_last=True)))


def test_accumulation_runs_through_epoch_boundaries():
    # new-plays holds 1,394 windows of 64 tokens; 400 a batch: 3.5 batches per epoch, so the 4th and later steps
    # straddle epochs
    result = run(tiny(data="new-plays", batch_size=400, steps=5, warmup_steps=0, toggles={"grad_accum": 4}, **QUICK))
    assert result.status == "ok" and len(result.steps) == 5
    assert {s.tokens for s in result.steps} == {400 * 64}
    assert result.tokens_per_s == pytest.approx(400 * 64 / (result.step_ms.median / 1e3))


def test_a_batch_fn_the_step_cannot_split_is_refused_naming_batch_fn():
    def short(batch_size, device):  # returns 3 rows whatever it is asked for
        return regression_batch(3, device)

    cfg = tiny(model=Regressor, batch_fn=short, loss_fn=mse_loss, batch_size=8, toggles={"grad_accum": 4}, **QUICK)
    result = run(cfg, catch_errors=True)
    assert result.status == "failed" and "3 rows" in result.error and "batch_fn" in result.error


def test_tokens_per_s_counts_the_rows_a_batch_fn_really_returns():
    def half(batch_size, device):
        return regression_batch(batch_size // 2, device)

    result = run(tiny(model=Regressor, batch_fn=half, loss_fn=mse_loss, batch_size=16, tokens_per_sample=1,
                      steps=4, warmup_steps=0, **QUICK))
    assert result.tokens_per_step == 8 and {s.tokens for s in result.steps} == {8}


# -- a loss that is not finite ------------------------------------------------------------------------------
def nan_at(step: int):
    """A loss that is NaN at training step `step` (the engine calls loss_fn once before step 0, to count
    the model's FLOPs)."""
    calls = []

    def loss_fn(model, batch):
        calls.append(1)
        loss = mse_loss(model, batch)
        return loss * float("nan") if len(calls) == step + 2 else loss

    return loss_fn


def test_a_non_finite_loss_ends_the_run_as_diverged_at_its_step_keeping_the_measurements():
    cfg = tiny(model=Regressor, batch_fn=regression_batch, loss_fn=nan_at(6), steps=20, warmup_steps=1,
               log_every=5, measure_memory=False)
    result = run(cfg)
    assert result.status == "diverged" and result.diverged_at_step == 6 and "step 6" in result.error
    # the loss is read every 5 measured steps, so the sync point after step 10 found it: steps 0-10 ran and
    # are reported, nothing after (no sync point was added to find it sooner)
    assert len(result.steps) == 11 and result.losses[-1][0] == 5
    assert result.step_ms is not None and result.step_ms.n == 10 and result.tokens_per_s > 0
    assert not result.ok and result.finished
    table = scalekit.compare([result])
    assert table.loc[0, "status"] == "diverged" and "step 6" in table.loc[0, "note"]
    from scalekit.training.report import results_table

    assert "DIVERGED (not ok)" in results_table([result])


def test_the_cli_exits_1_and_shows_the_diverged_run(monkeypatch, capsys):
    import scalekit.training.engine

    real = scalekit.training.engine.run
    # the command line has no --lr: lr=1.0 under fp16 makes the tiny model's loss blow up within a few steps
    monkeypatch.setattr(scalekit.training.engine, "run", lambda cfg, **kw: real(dataclasses.replace(cfg, lr=1.0), **kw))
    code = main(["bench", "--preset", "tiny", "--device", "cpu", "--toggle", "fp16", "--steps", "60",
                 "--warmup-steps", "0"])
    out = capsys.readouterr().out
    assert code == 1 and "DIVERGED (not ok)" in out


# -- RunConfig: every field checked up front ----------------------------------------------------------------
@pytest.mark.parametrize("field,value,words", [
    ("measure_memory", 1, "True or False"), ("check_memory", "yes", "True or False"),
    ("label", "", "printable name"), ("label", "a\nb", "printable name"), ("label", 7, "printable name"),
    ("seed", -1, "from 0"), ("seed", 2**64, "from 0"), ("seed", 3.0, "integer"),
    ("lr", 5.0, "1e-08 to 1"), ("lr", 1e-12, "1e-08 to 1"), ("lr", float("nan"), "1e-08 to 1"),
    ("lr", True, "1e-08 to 1"), ("steps", 10**9, "100,000,000"), ("seq_len", 2**21, "1,048,576"),
    ("batch_size", True, "positive integer"), ("peak_tflops", -3, "positive number"), ("data", 3, "data source"),
    ("device", None, "'cuda:N'"),
])
def test_every_field_is_checked_for_type_and_range_with_its_name(field, value, words):
    with pytest.raises(ConfigError, match=rf"RunConfig\.{field}") as info:
        RunConfig(**{field: value})
    assert words in str(info.value)


def test_a_run_far_beyond_the_machines_memory_is_refused_before_building():
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=r"RunConfig.check_memory: .* GiB.*more than 1.1× this machine's limit of .* GiB"):
        run(RunConfig(preset="tiny", seq_len=200_000, device="cpu"))  # ≈5 TB of causal masks and activations
    assert time.perf_counter() - t0 < 10  # refused from the plan, not after minutes of allocating
    with pytest.raises(ConfigError, match="weights, gradients and AdamW state alone"):
        huge = lambda: torch.nn.Linear(2**20, 2**18)  # noqa: E731 - 1 TiB of fp32 weights: planned, never built
        run(RunConfig(model=huge, batch_fn=regression_batch, loss_fn=mse_loss, device="cpu"))


def test_the_memory_check_can_be_switched_off():
    small_machine = dataclasses.replace(CPU, total_mem_bytes=2**20)  # 1 MiB: the tiny GPT's plan is larger
    with pytest.raises(ConfigError, match="check_memory"):
        run(tiny(steps=1, warmup_steps=0, **QUICK), hw=small_machine)
    assert run(tiny(steps=1, warmup_steps=0, check_memory=False, **QUICK), hw=small_machine).status == "ok"


# -- out of memory, in words ----------------------------------------------------------------------------------
def test_the_cpu_allocators_out_of_memory_gets_the_same_hint_as_cudas():
    cpu = RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
                       "you tried to allocate 99999999999 bytes. Error code 12 (Cannot allocate memory)")
    cuda = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    for exc in (cpu, cuda):
        assert plain_error(exc).startswith("out of memory") and "smaller batch_size" in plain_error(exc)


# -- Ctrl-C inside a run ------------------------------------------------------------------------------------
def test_ctrl_c_inside_a_run_keeps_what_was_measured():
    calls = []

    def loss_fn(model, batch):
        calls.append(1)
        if len(calls) == 7:  # step 5 (one call before step 0 counts FLOPs)
            raise KeyboardInterrupt
        return mse_loss(model, batch)

    result = run(tiny(model=Regressor, batch_fn=regression_batch, loss_fn=loss_fn, steps=20, warmup_steps=1,
                      **QUICK))
    assert result.status == "stopped" and len(result.steps) == 5 and "interrupted" in " ".join(result.notes)


# -- the Lab after anything a run can raise -------------------------------------------------------------------
@pytest.mark.parametrize("raised", [SystemExit(3), KeyboardInterrupt(), RuntimeError("boom")],
                         ids=["SystemExit", "KeyboardInterrupt", "RuntimeError"])
def test_the_lab_stays_usable_after_anything_a_loss_fn_raises(raised):
    from scalekit import Lab

    calls = []

    def loss_fn(model, batch):
        calls.append(1)
        if len(calls) == 3:
            raise raised
        return mse_loss(model, batch)

    lab = Lab(model=Regressor, batch_fn=regression_batch, loss_fn=loss_fn, steps=6, warmup_steps=1, log_every=2,
              device="cpu", hw=CPU, measure_memory=False)
    before = {t.name for t in threading.enumerate()}
    assert lab.start()
    result = lab.wait(60)
    time.sleep(0.1)
    assert not lab.run_button.disabled and lab.stop_button.disabled and not lab.running
    assert not any(n.startswith("scalekit-lab") for n in {t.name for t in threading.enumerate()} - before)
    assert "building" not in lab.status.value
    if isinstance(raised, KeyboardInterrupt):
        assert result.status == "stopped"
    else:
        assert result.status == "failed" and type(raised).__name__ in lab.message.value
    calls.clear()
    calls.extend([1] * 10)  # the next run's loss_fn no longer raises
    assert lab.start() and lab.wait(60).status == "ok"


# -- files: atomic, umask, bad paths said up front --------------------------------------------------------------
def test_json_into_a_bad_place_is_refused_before_any_work(tmp_path, capsys):
    read_only = tmp_path / "ro"
    read_only.mkdir()
    read_only.chmod(0o555)
    cases = [tmp_path / "missing" / "r.json", tmp_path]
    if os.geteuid() != 0:  # root writes anywhere
        cases.append(read_only / "r.json")
    for path in cases:
        for command in ("ladder", "bench"):
            t0 = time.perf_counter()
            assert main([command, "--preset", "tiny", "--device", "cpu", "--json", str(path)]) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and str(path) in err and "Traceback" not in err
            assert time.perf_counter() - t0 < 5  # nothing ran


def test_a_failure_mid_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "results.json"
    target.write_text('{"old": true}')

    def half_then_crash(f):
        f.write('{"new": ')
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(target, half_then_crash)
    assert json.loads(target.read_text()) == {"old": True}
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_written_files_get_the_users_umask(tmp_path):
    old = os.umask(0o027)
    try:
        result = run(tiny(steps=1, warmup_steps=0, **QUICK))
        result.to_json(tmp_path / "r.json")
        checkpoint.save(torch.nn.Linear(2, 2), tmp_path / "w.pt")
    finally:
        os.umask(old)
    for name in ("r.json", "w.pt"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o640, name


def test_lab_saves_atomically_and_refuses_a_missing_folder(tmp_path):
    from scalekit import Lab

    lab = Lab(preset="tiny", steps=2, warmup_steps=0, device="cpu", hw=CPU, measure_memory=False)
    lab.start()
    lab.wait(60)
    lab.to_csv(tmp_path / "t.csv")
    lab.to_json(tmp_path / "t.json")
    assert json.loads((tmp_path / "t.json").read_text())["results"][0]["run"] == "baseline"
    with pytest.raises(ConfigError, match="does not exist"):
        lab.to_csv(tmp_path / "nope" / "t.csv")


# -- the token cache -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["empty", "truncated", "bytes changed", "record deleted", "file deleted"])
def test_a_damaged_token_cache_is_noticed_and_rebuilt_with_a_note(fresh_cache, damage, capsys):
    good = shakespeare.load_tokens("train").copy()
    path = fresh_cache / "shakespeare_char_train.bin"
    if damage == "empty":
        path.write_bytes(b"")
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:1000])
    elif damage == "bytes changed":
        data = bytearray(path.read_bytes())
        data[500:510] = b"\xff" * 10  # token ids far beyond the vocabulary
        path.write_bytes(bytes(data))
    elif damage == "record deleted":
        (fresh_cache / "shakespeare_char.json").unlink()
    else:
        path.unlink()
    shakespeare._VALIDATED.clear()  # a new process
    capsys.readouterr()
    again = shakespeare.load_tokens("train")
    note = capsys.readouterr().err
    assert (again == good).all()
    assert note.count("\n") == 1 and "rebuilt the token cache" in note and str(fresh_cache) in note


@pytest.mark.parametrize("record", [
    "[1, 2, 3]", "null", '"text"', "7", '{"format": 1, "val_fraction": 0.1}',
    '{"format": 1, "val_fraction": 0.1, "splits": {}}', '{"format": 1, "val_fraction": 0.1, "splits": [1]}',
    '{"format": 1, "val_fraction": 0.1, "splits": {"train": 5, "val": 6}}',
    '{"format": 1, "val_fraction": 0.1, "splits": {"train": {"tokens": "many"}, "val": {}}}',
], ids=["list", "null", "string", "number", "no splits", "empty splits", "splits a list", "split a number",
        "split fields wrong"])
def test_a_token_cache_record_of_the_wrong_shape_is_rebuilt_like_a_garbled_one(fresh_cache, record, capsys):
    good = shakespeare.load_tokens("train").copy()
    (fresh_cache / "shakespeare_char.json").write_text(record)
    (fresh_cache / "shakespeare_char_train.bin").write_bytes(b"\0" * 1000)  # a record that vouches for nothing
    shakespeare._VALIDATED.clear()  # a new process
    capsys.readouterr()
    again = shakespeare.load_tokens("train")
    note = capsys.readouterr().err
    assert (again == good).all()
    assert note.count("\n") == 1 and "rebuilt the token cache" in note and str(fresh_cache) in note


def _build_and_sum(start, sums) -> None:
    start.wait(60)
    sums.put(int(shakespeare.load_tokens("train").sum()))


def test_concurrent_builders_produce_one_correct_cache(fresh_cache):
    # four processes find the same empty cache and build it at the same moment.  Forked: each starts as a new
    # process would (no cache folder checked yet, the fixture cleared that), all four released together by the
    # barrier instead of seconds apart by their imports
    fork = multiprocessing.get_context("fork")
    start, sums = fork.Barrier(4), fork.SimpleQueue()
    procs = [fork.Process(target=_build_and_sum, args=(start, sums)) for _ in range(4)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        assert [p.exitcode for p in procs] == [0] * 4
        assert len({sums.get() for _ in procs}) == 1
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    assert shakespeare._problem(shakespeare._read_meta()) is None
    assert not list(fresh_cache.glob("*.tmp"))


# -- the command line: one line, never a traceback ---------------------------------------------------------------
@pytest.mark.parametrize("argv,words", [
    (["bench", "--device", "cuda"], "no CUDA GPU"),
    (["bench", "--device", "cuda:3"], "RunConfig.device"),
    (["bench", "--steps", "0"], "flag: --steps"),
    (["bench", "--seed", "-4"], "flag: --seed"),
    (["bench", "--toggle", "grad_accum=0"], "grad_accum"),
    (["bench", "--preset", "tiny", "--seq-len", "300000"], "--no-memory-check"),
    (["toggles", "warp"], "unknown toggle 'warp'"),
])
def test_cli_misuse_is_one_line_naming_the_flag(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and "Traceback" not in err


FLAG_VALUES = {
    "--preset": st.sampled_from(["tiny", "small", "nope", "", "auto"]),
    "--batch-size": st.integers(-3, 2**26).map(str) | st.just("x"),
    "--seq-len": st.integers(-3, 2**22).map(str),
    "--steps": st.integers(-2, 10**9).map(str),
    "--warmup-steps": st.integers(-2, 10).map(str),
    "--log-every": st.integers(-2, 10).map(str),
    "--data": st.sampled_from(["shakespeare", "synthetic", "auto", "web"]),
    "--device": st.sampled_from(["cpu", "auto", "cuda", "cuda:1", "tpu", ""]),
    "--seed": st.integers(-5, 2**65).map(str),
    "--peak-tflops": st.floats(allow_nan=True).map(str),
    "--toggle": st.sampled_from(["bf16", "fp16", "compile=fast", "grad_accum=3", "optim=sgd", "tf32", "ddp", "x"]),
}


@settings(max_examples=150, deadline=None)
@given(command=st.sampled_from(["bench", "plan", "ladder"]),
       flags=st.lists(st.sampled_from(list(FLAG_VALUES)), max_size=5).flatmap(
           lambda names: st.tuples(*[st.tuples(st.just(n), FLAG_VALUES[n]) for n in names])))
def test_fuzzed_cli_arguments_end_in_a_result_or_one_line(command, flags, monkeypatch_session_run):
    argv = [command] + [x for pair in flags for x in pair]
    err_lines = []
    try:
        import contextlib
        import io

        buffer = io.StringIO()
        with contextlib.redirect_stderr(buffer), contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
        err_lines = [line for line in buffer.getvalue().splitlines() if line.startswith("scalekit: error")]
    except SystemExit as exc:  # argparse: a flag's value of the wrong type, with its usage line
        assert exc.code == 2
        return
    assert code in (0, 1, 2)
    assert "Traceback" not in "".join(err_lines) and len(err_lines) <= 1


@pytest.fixture(scope="module")
def monkeypatch_session_run():
    """bench and ladder under fuzzing validate and plan for real, but do not train: their run is a stub."""
    import scalekit.training.engine
    import scalekit.training.ladder

    real = scalekit.training.engine.run

    def stub(cfg, on_step=None, on_status=None, stop=None, hw=None, catch_errors=False):
        hw = hw or scalekit.detect(cfg.device)
        resolved = cfg.resolve(hw)
        resolved.check_available(hw)
        scalekit.plan.check_fits(resolved, hw)
        return scalekit.RunResult(label=resolved.label, config=resolved.to_dict(), status="skipped")

    scalekit.training.engine.run = scalekit.training.ladder.run = stub
    yield
    scalekit.training.engine.run = scalekit.training.ladder.run = real


def test_nan_is_not_finite():  # the divergence check's own premise, on this platform
    assert not math.isfinite(float("nan")) and not math.isfinite(float("inf"))


def test_a_tilde_that_names_no_user_stays_as_written_and_is_refused_in_words(capsys):
    # pathlib's expanduser raised RuntimeError at a user giving --model '~0' (the flag fuzz found it)
    from scalekit.files import expand_user

    assert expand_user("~/a") == Path.home() / "a"
    assert expand_user("~0nosuchuser/x") == Path("~0nosuchuser/x")
    assert main(["generate", "--model", "~0nosuchuser"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--model" in err and "no such folder" in err, err
