"""Property tests: random values of every type at every RunConfig and GenerateConfig field, and at every flag of
every command, are accepted or refused in words that name what was given: a ConfigError naming the field
(`RunConfig.steps`), a one-line message naming the flag with exit code 2 — never another exception, never a
traceback.  The commands' work is a stub past its checks; a sample of whole configs that validation accepts is
built and run for one step (training) or a few tokens (generation), where a value that validates and then crashes
the build shows."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import io
import os

import pytest
import torch
from hypothesis import HealthCheck, event, given, reject, settings
from hypothesis import strategies as st

import scalekit
from scalekit import ConfigError, RunConfig
from scalekit.cli.main import main, parser
from scalekit.inference import GenerateConfig
from scalekit.inference.engine import generate as run_generation
from scalekit.inference.results import GenerateResult
from scalekit.measure.timing import Spread
from scalekit.toggles import TOGGLES
from scalekit.training.engine import (
    run as run_training,  # the real ones, whatever stubbed_work does to the modules
)
from scalekit.training.results import RunResult
from tests.families import PlainLM, lm_loss, token_pairs
from tests.helpers import CPU

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.function_scoped_fixture])
CLI_FUZZ = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                            HealthCheck.function_scoped_fixture])

# words a user may well type, and edge cases of the types the fields take
PLAUSIBLE = ["auto", "cpu", "cuda", "cuda:0", "cuda:1", "cuda:²", "cuda:٣", "tiny", "small", "shakespeare-char",
             "shakespeare", "shakespeare-raw", "synthetic", "new-plays", "custom", "random", "pretrained", "bf16",
             "", " ", "\n", "-1", "0", "1", "²", "nan", "inf", "1e309", "ROMEO:", "None", "True"]


class Tokenizerish:
    """Something with encode and decode, as a user's tokenizer has, that misbehaves in a chosen way."""

    def __init__(self, encoded):
        self.encoded = encoded

    def encode(self, text):
        if isinstance(self.encoded, BaseException):
            raise self.encoded
        return self.encoded

    def decode(self, ids):
        return "?"


TOKENIZERS = [Tokenizerish([1, 2]), Tokenizerish("ab"), Tokenizerish([-1]), Tokenizerish([10**9]),
              Tokenizerish(TypeError("x")), Tokenizerish(KeyError("q")), Tokenizerish(None), Tokenizerish([1.5])]
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-3, 300), st.floats(), st.floats(-1e3, 1e3),
    st.text(max_size=12), st.binary(max_size=6), st.complex_numbers(max_magnitude=10), st.sampled_from(PLAUSIBLE),
    st.fractions(max_denominator=5), st.just(object()), st.just(len), st.just(torch.nn.Linear(2, 2)),
    st.just(torch.ones(2)), st.sampled_from(TOKENIZERS),
)
ANY = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.tuples(inner, inner), st.dictionaries(st.text(max_size=6), inner, max_size=3),
    st.dictionaries(st.sampled_from(list(TOGGLES)), inner, max_size=3), st.lists(st.sampled_from(list(TOGGLES)),
                                                                                 max_size=4)), max_leaves=6)
# values that reach further into one field's checks than a value of a random type does
TOKEN_IDS = st.lists(st.lists(st.integers(-2, 10**6), max_size=5), min_size=1, max_size=3)
FIELD_VALUES = {
    "toggles": st.dictionaries(st.sampled_from(list(TOGGLES)), SCALARS, max_size=3)
    | st.lists(st.sampled_from(list(TOGGLES)), max_size=4),
    "prompts": TOKEN_IDS | st.text(max_size=30) | st.sampled_from(["é", "x" * 1100, "ROMEO:" * 170, ["a", ""]]),
    "tokenizer": st.sampled_from(TOKENIZERS),
    "model": st.sampled_from(["tiny", "small", "gpt2-124m", "shakespeare-char", len, torch.nn.Linear(2, 2),
                              lambda: torch.nn.Linear(2, 2)]),
}


def values(field: str):
    """Any value at all, or (as often) one of the values that field's checks look at closely."""
    return st.one_of(FIELD_VALUES.get(field, st.sampled_from(PLAUSIBLE) | st.integers(-3, 10**7)), ANY)


def accepted_or_refused_naming(owner: str, field: str, build) -> None:
    """build() either works or raises ConfigError whose words name owner.field; any other exception fails."""
    try:
        build()
    except ConfigError as exc:
        assert f"{owner}.{field}" in str(exc), f"{owner}.{field} not named in: {exc}"


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(RunConfig)])
@FUZZ
@given(data=st.data())
def test_every_run_config_field_takes_any_value_or_names_itself(field, data):
    value = data.draw(values(field))

    def build():
        cfg = RunConfig(**{field: value})
        scalekit.detect(cfg.device)  # what a run does first, before building anything
        cfg.resolve(CPU)
        cfg.check_available(CPU)

    accepted_or_refused_naming("RunConfig", field, build)


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(GenerateConfig)])
@FUZZ
@given(data=st.data())
def test_every_generate_config_field_takes_any_value_or_names_itself(field, data):
    value = data.draw(values(field))

    def build():
        cfg = GenerateConfig(**{field: value})
        scalekit.detect(cfg.device, "GenerateConfig")
        cfg.resolve(CPU)
        cfg.check_available(CPU)

    accepted_or_refused_naming("GenerateConfig", field, build)


# -- accepted configs, built and run ---------------------------------------------------------------------------
# Whole configs drawn from values a user may well pass (any toggle of the loop with True or one of its choices, the
# fields' small and edge values); those validation accepts are built and run on the tiny models, where a value that
# validates and then crashes the build would show.  Refused while building is fine if it is a ConfigError
# (ToggleUnavailable is one) in one line; any other exception fails.
BUILD_FUZZ = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                              HealthCheck.filter_too_much])
# not built here: compile (inductor's cold compile takes tens of CPU seconds; tests/toggles/test_compile*.py build it) and
# the toggles that need several processes (refused in one: the validation fuzz above tries them)
NOT_BUILT = {"compile", *(name for name, toggle in TOGGLES.items() if toggle.needs_process_group)}


def drawn_toggles(data, loop: str) -> dict:
    names = [name for name, toggle in TOGGLES.items() if loop in toggle.loops and name not in NOT_BUILT]
    chosen = data.draw(st.lists(st.sampled_from(names), unique=True, max_size=3), label="toggles")
    # its own choices, or a small number or False, which some toggles take too
    return {name: data.draw(st.sampled_from([True, *(TOGGLES[name].choices or ())]) | st.sampled_from([False, 0, 1, 3]),
                            label=name) for name in chosen}


OWN_SAMPLES = [(torch.randint(0, 65, (8,)), torch.randint(0, 65, (8,))) for _ in range(16)]
# the built-in GPT, or your model with synthetic batches or with your dataset
MODELS = st.sampled_from([{}, {"model": PlainLM, "batch_fn": token_pairs, "loss_fn": lm_loss, "tokens_per_sample": 8},
                          {"model": PlainLM, "dataset": OWN_SAMPLES, "loss_fn": lm_loss, "tokens_per_sample": 8}])


def drawn_run_config(data) -> dict:
    # fields that only go together (drawn apart, most of them would be refused)
    preset, init = data.draw(st.sampled_from([("tiny", "random"), ("auto", "random"), ("shakespeare-char", "random"),
                                              ("shakespeare-char", "pretrained")]))
    data_name, rounds = data.draw(st.sampled_from([("auto", None), ("shakespeare", None), ("synthetic", None),
                                                   ("shakespeare-raw", None), ("shakespeare-raw", 0), ("shakespeare-raw", 2)]))
    every, batches, new_tokens = data.draw(st.sampled_from([(0, 2, 0), (1, 1, 0), (1, 2, 3)]))
    # the preset's own sizes (None) only for the tiny one: shakespeare-char's step at its own is seconds of CPU
    size = st.integers(1, 8) if preset == "shakespeare-char" else st.none() | st.integers(1, 8)
    fields = st.fixed_dictionaries({
        "batch_size": size, "seq_len": size | st.integers(9, 24), "log_every": st.integers(1, 3),
        "lr": st.sampled_from([1e-8, 1e-3, 1.0]), "seed": st.integers(0, 2**63 - 1), "measure_memory": st.booleans(),
        "check_memory": st.booleans(), "label": st.sampled_from([None, "a run", "é"]),
        "adapter_targets": st.sampled_from([None, ("c_attn",), ("c_fc", "c_proj")]), "threads": st.sampled_from([None, 1])})
    return dict(data.draw(fields), preset=preset, init=init, data=data_name, transform_rounds=rounds, eval_every=every,
                eval_batches=batches, eval_new_tokens=new_tokens, **data.draw(MODELS), toggles=drawn_toggles(data, "train"),
                steps=1, warmup_steps=0, device="cpu")


def drawn_generate_config(data) -> dict:
    fields = st.fixed_dictionaries({
        "model": st.sampled_from(["shakespeare-char", "tiny", PlainLM]),
        "prompts": st.sampled_from(["ROMEO:", "ROMEO:" * 30, ["a", "bcd"], [[1, 2, 3]], [[5], [6, 7]]]),
        "max_new_tokens": st.integers(1, 4), "temperature": st.sampled_from([0.0, 0.5, 2.0]),
        "top_k": st.none() | st.integers(1, 70), "seed": st.integers(0, 2**63 - 1), "warmup_tokens": st.integers(0, 2),
        "quality": st.booleans(), "quality_windows": st.integers(1, 2), "quality_seq_len": st.none() | st.integers(2, 24),
        "measure_memory": st.booleans(), "threads": st.sampled_from([None, 1])})
    return dict(data.draw(fields), toggles=drawn_toggles(data, "generate"), device="cpu")


def validated_or_rejected(config_class, fields: dict):
    """The config, past what a run checks before it builds; one refused there is not one this sample builds
    (hypothesis draws another)."""
    try:
        cfg = config_class(**fields)
        cfg.resolve(CPU).check_available(CPU)
    except ConfigError:
        reject()
    return cfg


def built_and_run_or_refused_in_one_line(run, cfg) -> None:
    try:
        result = run(cfg)
    except ConfigError as exc:  # refused while building: fine, in one line a user can read
        assert len(str(exc).strip().splitlines()) == 1, f"refused in more than one line: {exc}"
        event("refused while building")  # (--hypothesis-show-statistics counts the outcomes)
        return
    event(f"built and ran: {result.status}")
    assert result.status in ("ok", "diverged"), (result.status, result.error, cfg)


@BUILD_FUZZ
@given(data=st.data())
def test_accepted_run_configs_build_and_run_one_step(data):
    cfg = validated_or_rejected(RunConfig, drawn_run_config(data))
    built_and_run_or_refused_in_one_line(run_training, cfg)


@BUILD_FUZZ
@given(data=st.data())
def test_accepted_generate_configs_build_and_generate(data):
    cfg = validated_or_rejected(GenerateConfig, drawn_generate_config(data))
    built_and_run_or_refused_in_one_line(run_generation, cfg)


# -- every flag of every command --------------------------------------------------------------------------------
# each command with what comes before its flags; ladder inference and tune --generate take other paths
COMMANDS = [("bench", []), ("plan", []), ("ladder", []), ("ladder", ["inference"]), ("export", ["hf"]),
            ("generate", []), ("tune", []), ("tune", ["--generate"]), ("launch", []), ("toggles", []),
            ("predict", ["gpt2-124m"]), ("plan-for", ["gpt2-124m"])]


def flags() -> list[tuple[str, list[str], argparse.Action]]:
    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    return [(command, before, action) for command, before in COMMANDS for action in sub.choices[command]._actions
            if action.option_strings and not isinstance(action, argparse._HelpAction)
            and action.option_strings[-1] not in before]


FLAGS = flags()


def flag_values(action: argparse.Action):
    if action.nargs == 0:  # a switch: no value
        return st.just(None)
    choices = list(action.choices) if action.choices else []
    return st.one_of(st.text(max_size=12), st.integers().map(str), st.integers(-3, 300).map(str),
                     st.floats().map(str), st.sampled_from(PLAUSIBLE + choices + ["bf16", "grad_accum=²", "x=y",
                                                                                 "compile=fast", "lora=0"]))


def stub_result(cfg, **_):
    """A measured run, past every check a real run makes before it builds (resolve, availability, the plan)."""
    hw = scalekit.detect(cfg.device)
    resolved = cfg.resolve(hw)
    resolved.check_available(hw)
    scalekit.plan.check_fits(resolved, hw)
    return RunResult(label=resolved.label, config=resolved.to_dict(), status="ok", tokens_per_s=1000.0,
                     step_ms=Spread.of([1.0, 1.1]))


def stub_generation(cfg, **_):
    hw = scalekit.detect(cfg.device, "GenerateConfig")
    resolved = cfg.resolve(hw)
    resolved.check_available(hw)
    return GenerateResult(label=resolved.label, config=resolved.to_dict(), status="ok", decode_tokens_per_s=100.0,
                          decode_ms=Spread.of([10.0]))


class StubTune:
    def __init__(self, best):
        self.best = best

    def table(self):
        import pandas as pd

        return pd.DataFrame([{"change": "none"}])

    def summary(self) -> str:
        return "stub"

    def to_dict(self) -> dict:
        return {"best": self.best.to_dict()}

    def export(self, target: str) -> str:
        from scalekit.hf.export import export_code

        return export_code(self.best, target)


def stub_autotune(cfg, **kw):
    """autotune past its checks: the search is tested on its own (tests/plan/test_autotune.py)."""
    (stub_generation if isinstance(cfg, GenerateConfig) else stub_result)(cfg)
    return StubTune(cfg.resolve(scalekit.detect(cfg.device)) if isinstance(cfg, RunConfig) else cfg)


@pytest.fixture(scope="module")
def stubbed_work(tmp_path_factory):
    """Every command's work past its checks is a stub: runs, generations, launches (restored afterwards); in
    a folder of its own, where the --json files the fuzz names are written."""
    here = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cli-fuzz"))
    targets = [("scalekit.training.engine", "run", stub_result), ("scalekit.training.ladder", "run", stub_result),
               ("scalekit.training.finetune", "run", stub_result), ("scalekit.autotune", "autotune", stub_autotune),
               ("scalekit.inference", "generate", stub_generation),
               ("scalekit.inference.ladder", "generate", stub_generation),
               ("scalekit.launch", "launch_run", lambda cfg, **kw: stub_result(cfg)),
               ("scalekit.launch.api", "launch_script", lambda *a, **kw: 0),
               ("scalekit.launch.commands", "run_torchrun", lambda cmd: 0)]
    saved = []
    for module, name, stub in targets:
        mod = importlib.import_module(module)
        saved.append((mod, name, getattr(mod, name)))
        setattr(mod, name, stub)
    yield
    for mod, name, real in saved:
        setattr(mod, name, real)
    os.chdir(here)


def run_cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse, if it got past main
            code = exc.code
    return code, err.getvalue()


@pytest.mark.parametrize("command,before,action", FLAGS,
                         ids=[" ".join([c, *b, a.option_strings[-1]]) for c, b, a in FLAGS])
@CLI_FUZZ
@given(data=st.data())
def test_every_flag_takes_any_value_or_is_refused_in_one_line_naming_it(command, before, action, data,
                                                                         stubbed_work):
    value = data.draw(flag_values(action))
    flag = action.option_strings[-1]
    argv = [command, *before, flag, *([] if value is None else [value])]
    argv += ["script.py"] if command == "launch" else []
    code, err = run_cli(argv)
    assert "Traceback" not in err, err
    if code == 2:
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1, err
        assert any(s in lines[0] for s in action.option_strings), f"{flag} not named in: {lines[0]}"
    else:
        assert code in (0, 1), (code, err)


def test_the_flag_fuzz_covers_every_command_and_flag():
    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    fuzzed = {(c, a.dest) for c, _, a in FLAGS}
    for command, p in sub.choices.items():
        for action in p._actions:
            if action.option_strings and not isinstance(action, argparse._HelpAction):
                assert (command, action.dest) in fuzzed, (command, action.option_strings)
