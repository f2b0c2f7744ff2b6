"""A model from the user's own package, from the terminal: `--model pkg.module:factory` with `--loss-fn` and
`--batch-fn` in the same form (and the same strings in RunConfig/GenerateConfig from Python), a factory that returns
a Transformers model run as one, and each way it can go wrong said in one line naming the flag and the spec.  The
package is written by the test to a temporary folder (tests/families.py's PlainLM shape and gpt2 config)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from scalekit import GenerateConfig, RunConfig, run
from scalekit.cli.main import main
from scalekit.errors import ConfigError
from scalekit.hf.family_of import model_adapter
from scalekit.hf.model import HFCausalLM
from tests.families import one_line
from tests.helpers import built, one_thread

PKG = "ownpkg_for_tests"  # a name no installed package has
ROOT = Path(__file__).resolve().parents[2]
MODELS = """
import torch

from tests.families import PlainLM, hf_config, lm_loss, token_pairs

BUILT = []  # where each real build of `make` happened (meta-device builds are scalekit's checks)


def make():
    model = PlainLM()
    BUILT.append(model.head.weight.device.type)
    return model


def loss(model, batch):
    return lm_loss(model, batch)


def batches(batch_size, device):
    return token_pairs(batch_size, device)


def make_hf():  # a Transformers model, from your package
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(hf_config("gpt2"))


class Factories:
    @staticmethod
    def small():
        return PlainLM(d=16)


def broken():
    raise RuntimeError("no weights in the attic")


def not_a_module():
    return {"layers": 2}


not_a_function = 42
instance = PlainLM(d=8)  # a module itself, not a factory
"""


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    """The folder holding the package `PKG` (models.py above, and a module that fails as it is imported)."""
    folder = tmp_path_factory.mktemp("workdir")
    (folder / PKG).mkdir()
    (folder / PKG / "__init__.py").write_text("")
    (folder / PKG / "models.py").write_text(textwrap.dedent(MODELS))
    (folder / PKG / "needs_more.py").write_text("import a_library_nobody_installed\n")
    yield folder
    for name in [m for m in sys.modules if m == PKG or m.startswith(PKG + ".")]:
        del sys.modules[name]


@pytest.fixture
def on_path(package, monkeypatch) -> Path:
    monkeypatch.syspath_prepend(str(package))
    return package


QUICK = ["--steps", "2", "--warmup-steps", "0", "--device", "cpu", "--threads", "1"]


def test_bench_trains_the_model_your_package_builds_with_your_loss_and_batches(on_path, tmp_path):
    from ownpkg_for_tests import models

    models.BUILT.clear()
    out = tmp_path / "bench.json"
    assert main(["bench", "--model", f"{PKG}.models:make", "--loss-fn", f"{PKG}.models:loss",
                 "--batch-fn", f"{PKG}.models:batches", "--batch-size", "4", *QUICK, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["status"] == "ok", result
    assert (result["config"]["model"], result["config"]["loss_fn"], result["config"]["batch_fn"]) == \
        ("make", "loss", "batches")
    assert "cpu" in models.BUILT  # your factory built the model that trained, for real (not only on meta)
    assert 3.5 < result["final_loss"] < 5.0  # cross-entropy over 65 ids from random weights: ln 65 ≈ 4.17


def test_a_factory_that_returns_a_transformers_model_runs_as_one(on_path, tmp_path, capsys):
    out = tmp_path / "bench.json"
    # no --loss-fn, no --batch-fn: the Hugging Face family's own (the shipped corpus, the model's .loss)
    assert main(["bench", "--model", f"{PKG}.models:make_hf", "--toggle", "sdpa", "--batch-size", "2",
                 "--seq-len", "16", *QUICK, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["status"] == "ok" and result["config"]["data"] == "shakespeare", result
    assert any("SDPA ran" in note for note in result["notes"]), result["notes"]  # the toggle reached the model


def test_a_lambda_returning_a_transformers_model_is_that_family_and_trains_as_causal_lm_does():
    """RunConfig(model=lambda: AutoModelForCausalLM.from_config(c)) was refused (no batch_fn, no loss_fn): it is now
    the Hugging Face family, and trains exactly as the same config through scalekit.hf.causal_lm."""
    from transformers import AutoModelForCausalLM

    from scalekit.hf import causal_lm
    from tests.families import hf_config

    config = hf_config("gpt2")
    fields = dict(steps=2, warmup_steps=0, log_every=1, batch_size=2, seq_len=16, device="cpu", threads=1,
                  measure_memory=False, check_memory=False)
    by_lambda = RunConfig(model=lambda: AutoModelForCausalLM.from_config(config), toggles=["sdpa"], **fields)
    assert isinstance(model_adapter(by_lambda.model), HFCausalLM)
    with built(by_lambda) as ctx:  # the toggle set the attention the Transformers way
        assert ctx.base_model.config._attn_implementation == "sdpa"
        assert type(ctx.base_model).__name__ == "GPT2LMHeadModel"
    with one_thread():
        mine, theirs = run(by_lambda), run(RunConfig(model=causal_lm(config), toggles=["sdpa"], **fields))
    assert mine.status == theirs.status == "ok" and len(mine.losses) == 2
    assert mine.losses == theirs.losses  # same seed, same weights, same corpus batches, same loss


def test_python_takes_the_same_strings(on_path):
    from ownpkg_for_tests import models

    cfg = RunConfig(model=f"{PKG}.models:make", loss_fn=f"{PKG}.models:loss", batch_fn=f"{PKG}.models:batches")
    assert (cfg.model, cfg.loss_fn, cfg.batch_fn) == (models.make, models.loss, models.batches)
    assert RunConfig(model=f"{PKG}.models:Factories.small", loss_fn=models.loss,  # dotted after the colon
                     batch_fn=models.batches).model is models.Factories.small
    assert GenerateConfig(model=f"{PKG}.models:make", prompts=[[1, 2]], max_new_tokens=2).model is models.make
    assert RunConfig(model=f"{PKG}.models:instance", loss_fn=models.loss, batch_fn=models.batches).model \
        is models.instance
    with pytest.raises(ConfigError, match=rf"^RunConfig\.model {PKG}\.models:broken: the factory raised "
                                          r"RuntimeError: no weights in the attic$"):
        RunConfig(model=f"{PKG}.models:broken", loss_fn=models.loss, batch_fn=models.batches)
    with pytest.raises(ConfigError, match=rf"^RunConfig\.loss_fn {PKG}\.models:not_a_function: is an int, not a"):
        RunConfig(model=models.make, loss_fn=f"{PKG}.models:not_a_function", batch_fn=models.batches)


SPEC = f"{PKG}.models"
# argv (after `bench`) -> the whole message after "scalekit: error: "
FAILURES = {
    "missing module": (["--model", f"{PKG}.nowhere:make"],
                       f"--model {PKG}.nowhere:make: no module named '{PKG}.nowhere' (looked in the current "
                       f"directory, {{cwd}}, and sys.path)"),
    "missing package": (["--model", "no_such_pkg_here.models:make"],
                        "--model no_such_pkg_here.models:make: no module named 'no_such_pkg_here' (looked in the "
                        "current directory, {cwd}, and sys.path)"),
    "import fails": (["--model", f"{PKG}.needs_more:make"],
                     f"--model {PKG}.needs_more:make: importing {PKG}.needs_more failed: ModuleNotFoundError: No "
                     f"module named 'a_library_nobody_installed'"),
    "missing attribute": (["--model", f"{SPEC}:nope"],
                          f"--model {SPEC}:nope: {SPEC} has no attribute 'nope' (its functions and classes: "
                          f"PlainLM, hf_config, lm_loss, token_pairs, make, loss, batches, make_hf)"),
    "factory raises": (["--model", f"{SPEC}:broken"],
                       f"--model {SPEC}:broken: the factory raised RuntimeError: no weights in the attic"),
    "not a module": (["--model", f"{SPEC}:not_a_module"],
                     f"--model {SPEC}:not_a_module: the factory returned a value of type dict, not a torch.nn.Module"),
    "not a spec": (["--model", "models.py"],
                   "--model 'models.py': expected package.module:name (a module Python can import, a colon, then "
                   "a name in it), e.g. mypkg.models:make_model"),
    "loss not a function": (["--model", f"{SPEC}:make", "--loss-fn", f"{SPEC}:not_a_function",
                             "--batch-fn", f"{SPEC}:batches"],
                            f"--loss-fn {SPEC}:not_a_function: is an int, not a function"),
    "batch_fn missing": (["--model", f"{SPEC}:make", "--loss-fn", f"{SPEC}:loss", "--batch-fn", f"{SPEC}:batchs"],
                         f"--batch-fn {SPEC}:batchs: {SPEC} has no attribute 'batchs' (its functions and classes: "
                         f"PlainLM, hf_config, lm_loss, token_pairs, make, loss, batches, make_hf)"),
    "no loss_fn": (["--model", f"{SPEC}:make", "--batch-fn", f"{SPEC}:batches"],
                   f"--model {SPEC}:make builds your own nn.Module, which trains with --loss-fn too "
                   f"(package.module:name); a Transformers model needs neither"),
    "neither": (["--model", f"{SPEC}:make"],
                f"--model {SPEC}:make builds your own nn.Module, which trains with --loss-fn and --batch-fn too "
                f"(package.module:name); a Transformers model needs neither"),
    "two models": (["--model", f"{SPEC}:make_hf", "--hf-model", "gpt2"],
                   f"--model {SPEC}:make_hf and --hf-model gpt2 both name the model: give one"),
}


@pytest.mark.parametrize("case", list(FAILURES))
def test_each_failure_is_one_line_naming_the_flag_and_the_spec(case, on_path, capsys):
    argv, message = FAILURES[case]
    assert main(["bench", *argv, *QUICK]) == 2
    err = capsys.readouterr().err
    assert err == f"scalekit: error: {message.format(cwd=os.getcwd())}\n"


def test_other_commands_take_it_and_generation_keeps_its_names(on_path, capsys):
    assert main(["plan", "--model", f"{SPEC}:make", "--loss-fn", f"{SPEC}:loss", "--batch-fn", f"{SPEC}:batches",
                 "--batch-size", "2", "--device", "cpu"]) == 0
    assert "FLOPs/step" in capsys.readouterr().out
    assert main(["export", "hf", "--model", f"{SPEC}:make", "--loss-fn", f"{SPEC}:loss",
                 "--batch-fn", f"{SPEC}:batches"]) == 0
    assert "# Assumes `model` (your make, built as scalekit built it)" in capsys.readouterr().out
    assert main(["toggles", "--model", f"{SPEC}:make", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.startswith("what applies to your model (PlainLM):")
    # generation: a name without a colon is a model name, as before; with a colon, your package's model
    from ownpkg_for_tests import models

    from scalekit.cli.main import _generate_config
    from scalekit.cli.parser import parser

    assert _generate_config(parser().parse_args(["generate", "--model", "tiny"]), {}).model == "tiny"
    assert _generate_config(parser().parse_args(["generate", "--model", f"{SPEC}:make"]), {}).model is models.make
    assert main(["ladder", "inference", "--model", f"{SPEC}:make", "--loss-fn", f"{SPEC}:loss"]) == 2
    assert capsys.readouterr().err == ("scalekit: error: scalekit ladder inference: --loss-fn train your model; "
                                       "generation takes --model alone\n")


def test_the_program_finds_the_package_in_the_current_directory_and_says_a_failure_in_one_line(package, tmp_path):
    """As the `scalekit` console script runs: its own folder first on sys.path, not the current directory (which
    scalekit adds, as `python -m` would); stderr is the one line, the exit code 2."""
    launcher = tmp_path / "bin" / "scalekit_program.py"
    launcher.parent.mkdir()
    launcher.write_text("import sys\nfrom scalekit.cli.main import program\nsys.exit(program())\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # scalekit and tests; the package only in the current directory
    proc = subprocess.run([sys.executable, str(launcher), "bench", "--model", f"{SPEC}:broken", *QUICK], cwd=package,
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2
    assert proc.stderr == f"scalekit: error: --model {SPEC}:broken: the factory raised RuntimeError: no weights in " \
                          f"the attic\n"
    assert one_line(proc.stderr) and proc.stdout == ""
