"""Exports of your own nn.Module carry head_only and quantized_base: the code freezes all but a copy of the output
layer, and swaps the adapters' target layers for bitsandbytes ones, as scalekit's run does.  The exported code runs
(tests/run_exported.py, each target whose library is installed) and trains the same parameters, and holds the same
layer types at the same names, as the model scalekit builds for the same config."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the exported code's Trainer")
pytestmark = pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="quantized_base's layers need bitsandbytes")  # not imported at collection: the forking tests run first

from scalekit import RunConfig  # noqa: E402
from scalekit.hf.export import export_code  # noqa: E402
from tests.helpers import built  # noqa: E402
from tests.hf.test_hf_export_runs import LIBRARIES, OWN_MODEL  # noqa: E402

CASES = {  # id -> (toggles, targets it runs in)
    "head_only": ({"head_only": True}, ("hf", "accelerate", "lightning")),
    "qlora-nf4": ({"lora": 4, "quantized_base": "nf4"}, ("hf", "accelerate", "lightning")),
    "qlora-int8": ({"lora": 4, "quantized_base": "int8"}, ("hf",)),
}
# after the exported code: the model's layers by name (peft's wrapper prefix left out) with their classes
LAYER_TYPES = """
import json as _json
WRAPPERS = ("", "base_model", "base_model.model")  # peft's, around your model (Accelerate's `model` is yours)
print("LAYERS " + _json.dumps({_n.removeprefix("base_model.model."): f"{type(_m).__module__}.{type(_m).__name__}"
                                for _n, _m in model.named_modules() if _n not in WRAPPERS}), flush=True)
"""


def own_config(toggles: dict) -> RunConfig:
    space: dict = {"samples": 8}
    exec(OWN_MODEL, space)
    return RunConfig(model=space["BlocksLM"], dataset=space["train_dataset"], loss_fn=space["loss_fn"], batch_size=8,
                     tokens_per_sample=16, toggles=toggles, steps=2, warmup_steps=0, lr=1e-3, device="cpu")


def layer_types(model) -> dict[str, str]:
    return {name.removeprefix("base_model.model."): f"{type(m).__module__}.{type(m).__name__}"
            for name, m in model.named_modules() if name not in ("", "base_model", "base_model.model")}


def scalekits(toggles: dict) -> dict:
    """What scalekit's run of the config trains and holds: trainable names and count, module classes, layers."""
    with built(own_config(toggles)) as ctx:
        trained = [(n, p.numel()) for n, p in ctx.model.named_parameters() if p.requires_grad]
        return {"trained": sorted(n for n, _ in trained), "trained_numel": sum(k for _, k in trained),
                "modules": sorted({type(m).__name__ for m in ctx.model.modules()}),
                "layers": layer_types(ctx.model)}


@pytest.fixture(scope="module")
def ran() -> dict:
    """(target, case) -> what the exported code did, and its layers after training."""
    cases = [{"id": f"{target}/{name}", "code": export_code(own_config(toggles), target) + LAYER_TYPES,
              "samples": 8, "prelude": OWN_MODEL}
             for name, (toggles, targets) in CASES.items() for target in targets
             if importlib.util.find_spec(LIBRARIES[target]) is not None]
    proc = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "run_exported.py")], input=json.dumps(cases),
                          capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    lines = proc.stdout.splitlines()
    results = [json.loads(line[7:]) for line in lines if line.startswith("RESULT ")]
    layers = [json.loads(line[7:]) for line in lines if line.startswith("LAYERS ")]
    assert proc.returncode == 0 and len(results) == len(cases), proc.stderr[-3000:]
    assert all("error" not in r for r in results), [r["error"] for r in results if "error" in r]
    assert len(layers) == len(cases), proc.stdout[-3000:]
    return {tuple(r["id"].split("/")): {**r, "layers": layer} for r, layer in zip(results, layers, strict=True)}


def test_the_export_carries_both_instead_of_naming_them_not_carried():
    for name, (toggles, _) in CASES.items():
        for target in LIBRARIES:
            code = export_code(own_config(toggles), target)
            assert "# not carried" not in code, (name, target)
            compile(code, f"{name}-{target}.py", "exec")
    head = export_code(own_config({"head_only": True}), "hf")
    assert "model.head = copy.deepcopy(model.head).requires_grad_(True)" in head
    nf4 = export_code(own_config({"lora": 4, "quantized_base": "nf4"}), "hf")
    assert "for name in ['blocks.0.0', 'blocks.1.0']:" in nf4 and "quant_type='nf4'" in nf4
    assert nf4.index("bnb.nn.Linear4bit(") < nf4.index("get_peft_model(")  # swapped first, then adapted


@pytest.mark.parametrize("case,target", [(c, t) for c, (_, targets) in CASES.items() for t in targets])
def test_the_exported_code_trains_and_swaps_what_scalekit_does(ran, case, target):
    if importlib.util.find_spec(LIBRARIES[target]) is None:
        pytest.skip(f"{LIBRARIES[target]} is not installed")
    facts, mine = ran[(target, case)], scalekits(CASES[case][0])
    assert facts["steps"] > 0 and facts["network_attempts"] == []
    assert (facts["trained"], facts["trained_numel"]) == (mine["trained"], mine["trained_numel"])
    assert facts["modules"] == mine["modules"]
    assert facts["layers"] == mine["layers"]  # every layer, by name: the same class (bitsandbytes' where swapped)
    swapped = {n: t for n, t in mine["layers"].items() if t.startswith("bitsandbytes.")}
    if "quantized_base" in CASES[case][0]:
        kind = "Linear4bit" if CASES[case][0]["quantized_base"] != "int8" else "Linear8bitLt"
        assert swapped == {f"blocks.{i}.0.base_layer": f"bitsandbytes.nn.modules.{kind}" for i in range(2)}
    else:
        assert swapped == {} and mine["trained"] == ["head.bias", "head.weight"]


def test_a_function_returning_a_transformers_model_is_exported_as_one():
    from transformers import AutoModelForCausalLM

    from tests.families import hf_config

    config = hf_config("gpt2")
    code = export_code(RunConfig(model=lambda: AutoModelForCausalLM.from_config(config), toggles={"head_only": True}),
                       "hf")
    assert "# Assumes `config` (a transformers config)" in code and "model = AutoModelForCausalLM.from_config(" in code
    assert "model.set_output_embeddings(copy.deepcopy(model.get_output_embeddings())" in code  # Transformers' spelling
