"""The command line's flags come from the config dataclasses: every field has a flag (or is listed with its
reason), every flag sets a field (or is listed), and a flag's conversion, default and help are its field's."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shlex
from pathlib import Path

import pytest

from scalekit.cli import main as cli
from scalekit.cli.fields import (
    DECLARED_IN_CLI,
    FLAG_ALIASES,
    NO_COUNTERPART,
    derived_fields,
    field_docs,
    flags_of,
)
from scalekit.cli.parser import _parser, parser
from scalekit.inference.config import GenerateConfig
from scalekit.toggles import TOGGLES
from scalekit.training.config import PRESET_NAMES, RunConfig
from scalekit.training.ladder import LADDERS
from tests.own_files import write_texts

CONFIGS = (RunConfig, GenerateConfig)
ROOT = Path(__file__).resolve().parents[2]


def commands(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def option_strings(p: argparse.ArgumentParser) -> set[str]:
    return {s for a in p._actions if not isinstance(a, argparse._HelpAction) for s in a.option_strings}


def fields_without_flags(p: argparse.ArgumentParser, configs=CONFIGS) -> list[str]:
    """'Owner.field' for each field no command's parser has a flag for, and NO_COUNTERPART does not list."""
    every_flag = set().union(*(option_strings(c) for c in commands(p).values()))
    missing = []
    for cls in configs:
        flags = flags_of(cls)
        for f in dataclasses.fields(cls):
            name = f"{cls.__name__}.{f.name}"
            if name not in NO_COUNTERPART and not set(flags.get(f.name, ())) & every_flag:
                missing.append(name)
    return missing


def flags_without_fields(p: argparse.ArgumentParser) -> list[str]:
    """'command --flag' for each flag that sets no config field and NO_COUNTERPART does not list."""
    known = {flag for cls in CONFIGS for flags in flags_of(cls).values() for flag in flags}
    return [f"{command} {flag}" for command, sub in commands(p).items() if f"scalekit {command}" not in NO_COUNTERPART
            for flag in sorted(option_strings(sub)) if flag not in known and flag not in NO_COUNTERPART]


def fresh_parser() -> argparse.ArgumentParser:
    return _parser.__wrapped__(tuple(TOGGLES), tuple(LADDERS))  # not the cached one: the tests change it


def test_every_config_field_has_a_flag_or_is_listed_with_its_reason():
    assert fields_without_flags(parser()) == []


def test_every_flag_sets_a_field_or_is_listed_with_its_reason():
    assert flags_without_fields(parser()) == []


def test_the_checks_catch_a_field_without_a_flag_and_a_flag_without_a_field():
    @dataclasses.dataclass
    class RunConfigWithMore:
        steps: int = 20
        """Measured steps."""
        probe_knob: int = 1
        """A field no flag sets."""

    assert fields_without_flags(parser(), configs=(RunConfigWithMore,)) == ["RunConfigWithMore.probe_knob"]
    p = fresh_parser()
    commands(p)["bench"].add_argument("--probe-knob", type=int)
    assert flags_without_fields(p) == ["bench --probe-knob"]


def test_the_tables_name_only_fields_and_flags_that_exist_each_with_a_reason():
    fields = {f"{cls.__name__}.{f.name}" for cls in CONFIGS for f in dataclasses.fields(cls)}
    every_flag = set().union(*(option_strings(c) for c in commands(parser()).values()))
    for key, reason in NO_COUNTERPART.items():
        assert isinstance(reason, str) and len(reason) > 10, key
        if key.startswith("--"):
            assert key in every_flag, f"{key} is listed but no command has it"
        elif key.startswith("scalekit "):
            assert key.split()[1] in commands(parser()), key
        else:
            assert key in fields, f"{key} is listed but is no field"
    for key, (flags, reason) in {**DECLARED_IN_CLI, **{k: ((f,), r) for k, (f, r) in FLAG_ALIASES.items()}}.items():
        assert key in fields and key not in NO_COUNTERPART and len(reason) > 10, key
        assert set(flags) <= every_flag, (key, flags)


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_a_derived_flag_has_its_fields_conversion_default_and_help(cls):
    command = commands(parser())["bench" if cls is RunConfig else "generate"]
    actions = {a.dest: a for a in command._actions}
    docs = field_docs(cls)
    assert derived_fields(cls), cls
    for f in dataclasses.fields(cls):
        if f.name not in derived_fields(cls):
            continue
        action = actions[f.name]
        assert action.default == f.default, f.name
        assert " ".join(docs[f.name].split()[:4]) in action.help, f.name
        dashed = f.name.replace("_", "-")
        if isinstance(f.default, bool):  # a switch away from the default
            assert action.const is (not f.default) and action.nargs == 0, f.name
            flag = f"--no-{dashed}" if f.default else f"--{dashed}"
        else:
            assert action.type.__name__ in str(f.type), (f.name, action.type, f.type)
            flag = f"--{dashed}"
        assert action.option_strings == [FLAG_ALIASES.get(f"{cls.__name__}.{f.name}", (flag,))[0]], f.name


def help_blocks(text: str) -> dict[str, str]:
    """`--help`'s text of each option (its first spelling: its lines joined), keyed by that spelling."""
    blocks: dict[str, str] = {}
    key = None
    for line in text.splitlines():
        if line.startswith("  -"):
            key = line.split()[0].rstrip(",")
            blocks[key] = line
        elif key is not None and line.startswith("    "):
            blocks[key] += " " + line.strip()
        else:
            key = None
    return blocks


@pytest.mark.parametrize("command", ["bench", "plan", "ladder", "export", "tune", "generate"])
def test_help_shows_every_option_with_its_help_and_the_fields_default(command, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "4000")  # no wrapping inside a help text
    cls = GenerateConfig if command == "generate" else RunConfig
    assert cli.main([command, "--help"]) == 0
    text = capsys.readouterr().out
    lines = help_blocks(text)
    for action in commands(parser())[command]._actions:
        flag = action.option_strings[-1] if action.option_strings else None
        if flag is None or isinstance(action, argparse._HelpAction):
            continue
        line = lines[action.option_strings[0]]
        assert len(line.split(maxsplit=2)) > 1 and action.help and action.help.split()[0] in line, flag
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    for name in derived_fields(cls):
        a = next(a for a in commands(parser())[command]._actions if a.dest == name)
        if a.option_strings and defaults[name] is not None and not isinstance(defaults[name], bool):
            assert f"(default: {defaults[name]})" in lines[a.option_strings[0]], name
    if command == "bench":
        assert "(default: 20)" in lines["--steps"] and "(default: 3)" in lines["--warmup-steps"]
        assert "(default: 5)" in lines["--log-every"] and "(default: 1337)" in lines["--seed"]
        assert all(name in lines["--preset"] for name in PRESET_NAMES), lines["--preset"]


def test_no_flags_make_the_configs_defaults():
    assert cli._config(parser().parse_args(["bench"]), {}) == RunConfig()
    assert cli._generate_config(parser().parse_args(["generate"]), {}) == GenerateConfig()


def test_flags_reach_their_fields():
    args = parser().parse_args(["bench", "--steps", "7", "--warmup-steps", "1", "--log-every", "2", "--lr", "0.01",
                                "--eval-every", "2", "--no-measure-memory", "--no-memory-check", "--seed", "5",
                                "--toggle", "bf16"])
    cfg = cli._config(args, cli._toggles(args))
    assert (cfg.steps, cfg.warmup_steps, cfg.log_every, cfg.lr, cfg.eval_every, cfg.seed) == (7, 1, 2, 0.01, 2, 5)
    assert cfg.measure_memory is False and cfg.check_memory is False and cfg.toggles == {"bf16": True}
    args = parser().parse_args(["generate", "--prompt", "AB", "--prompt", "CD", "--temperature", "0.5",
                                "--top-k", "3", "--quality-windows", "2", "--no-quality", "--model", "tiny"])
    gen = cli._generate_config(args, {})
    assert (gen.prompts, gen.temperature, gen.top_k, gen.quality_windows, gen.quality, gen.model) == \
        (["AB", "CD"], 0.5, 3, 2, False, "tiny")


def test_a_ladders_generation_takes_the_fields_both_configs_have_and_refuses_training_ones(capsys):
    args = parser().parse_args(["ladder", "inference", "--seed", "9", "--no-measure-memory", "--max-new-tokens", "5"])
    gen = cli._generate_config(args, {}, ladder=True)
    assert (gen.seed, gen.measure_memory, gen.max_new_tokens) == (9, False, 5)
    assert cli.main(["ladder", "inference", "--lr", "0.01"]) == 2
    assert "--lr set how training is measured" in capsys.readouterr().err


def documented_commands() -> list[str]:
    """The `scalekit ...` command lines of README.md's examples and of the notebooks' text, placeholders filled."""
    texts = [(ROOT / "README.md").read_text()]
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        texts += ["".join(c["source"]) for c in json.loads(nb.read_text())["cells"]]
    found = []
    for text in texts:
        found += [m.split("  #")[0].split(" | ")[0] for m in re.findall(r"^\$ (scalekit .*)$", text, re.M)]
        found += re.findall(r"`(scalekit [^`\n]*)`", text)
    placeholders = {"N": "2", "R": "0", "HOST:PORT": "localhost:29500"}
    lines = []
    for line in found:
        words = [placeholders.get(w, w) for w in shlex.split(line)[1:]]
        if "..." in words or "--toggle" == words[-1]:  # an elided flag: no command to run
            continue
        alternatives = [w.split("|") for w in words]  # "export hf|accelerate|lightning": each of them
        for choice in alternatives[1] if len(alternatives) > 1 else [None]:
            lines.append(shlex.join([words[0], *([choice] if choice else []), *words[2:]]))
    return sorted(set(lines))


def test_the_documented_commands_are_found():
    found = documented_commands()
    assert len(found) >= 20, found
    assert "bench --preset tiny --toggle compile=max-autotune --toggle bf16 --json result.json" in found


def builds_a_generation(args) -> bool:
    return args.command == "generate" or (args.command == "ladder" and args.kind == "inference") or \
        (args.command == "tune" and args.generate)


@pytest.fixture(scope="module")
def docs_checkpoint(tmp_path_factory):
    """The docs' ./my-model: a checkpoint folder as save_pretrained writes one (written once, where a line needs it)."""
    from tests.own_files import save_checkpoint

    return save_checkpoint("gpt2", tmp_path_factory.mktemp("docs") / "my-model")


@pytest.mark.parametrize("line", documented_commands())
def test_a_documented_command_still_parses_and_builds_its_config(line, tmp_path, request):
    files = {"train.jsonl": write_texts(tmp_path / "a", ["A line of text."], "jsonl", field="body"),
             "plays.jsonl": write_texts(tmp_path / "b", ["A line of text."], "jsonl")}  # the docs' data files
    if "./my-model" in shlex.split(line):
        files["./my-model"] = request.getfixturevalue("docs_checkpoint")
    args = parser().parse_args([str(files.get(w, w)) for w in shlex.split(line)])
    toggles = cli._toggles(args) if hasattr(args, "toggle") else {}
    if builds_a_generation(args):
        cfg = cli._generate_config(args, toggles, ladder=args.command != "generate")
        assert isinstance(cfg, GenerateConfig)
    elif args.command in ("bench", "plan", "export", "ladder", "tune"):
        assert isinstance(cli._config(args, toggles), RunConfig)


def test_an_error_names_the_flag_of_each_field_it_names():
    from scalekit.cli.parser import flag_names

    assert flag_names("RunConfig.warmup_steps must be ...").endswith("(flag: --warmup-steps)")
    assert flag_names("RunConfig.check_memory and RunConfig.model").endswith("(flag: --no-memory-check, --hf-model, --model)")
    assert flag_names("GenerateConfig.quality_windows ...").endswith("(flag: --quality-windows)")
    assert flag_names("RunConfig.loss_fn must be a function") == "RunConfig.loss_fn must be a function (flag: --loss-fn)"
    assert flag_names("RunConfig.tokens_per_sample ...") == "RunConfig.tokens_per_sample ..."  # a field without a flag
