"""The exported code runs where it was exported, and does what the toggles say: every framework whose library is
installed, a set of toggle combinations, a tiny GPT-2 on one batch an epoch (tests/run_exported.py runs them, in
one process, each in a fresh directory, and reports what each run did)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", reason="the exported code builds a transformers model")

from scalekit import RunConfig  # noqa: E402
from scalekit.hf.export import export_code  # noqa: E402

LIBRARIES = {"hf": "transformers", "accelerate": "accelerate", "lightning": "lightning"}
# optimizer steps over one batch of samples: the Trainer's default 3 epochs; the loop's one; Lightning's max_steps
STEPS = {"hf": 3, "accelerate": 1, "lightning": 2}
LORA_8_TRAINS = 16_384  # r·(in + out) over the 4 linear layers of tiny's 2 blocks

# id: (toggles, batch_size, what the run shows: fact -> its value, or a test of it); each trains on batch_size samples,
# one optimizer step an epoch
CASES = {
    "baseline": ({}, 8, {"optimizer": "torch.optim.adamw.AdamW", "compile": [], "checkpointing": False, "autocast": [],
                         "trained": lambda names: len(names) > 20 and not any("lora_" in n for n in names)}),
    "bf16-accum4": ({"bf16": True, "grad_accum": 4}, 32, {"mixed_precision": "bf16", "accumulation": 4,
                                                          "autocast": ["bfloat16"]}),
    "compile": ({"compile": "default"}, 8, {"compile": lambda calls: calls and {c["backend"] for c in calls} == {"inductor"}}),
    "checkpointing2": ({"checkpointing": 2}, 8, {"checkpointing": True}),
    "tf32": ({"tf32": True}, 8, {}),  # Transformers refuses tf32=True without an Ampere GPU: left out where there is none
    "adamw_bnb_8bit": ({"optim": "adamw_bnb_8bit"}, 8, {"optimizer": lambda name: name.startswith("bitsandbytes."),
                                                          "optimizer_bits": 8}),
    "adafactor": ({"optim": "adafactor"}, 8, {"optimizer": lambda name: name.endswith(".Adafactor")}),
    "lora8": ({"lora": 8}, 8, {"trained_numel": LORA_8_TRAINS, "trained": lambda names: all(".lora_" in n for n in names)}),
    "dora4": ({"dora": 4}, 8, {"trained": lambda names: any(".lora_magnitude_vector" in n for n in names)
                               and all(".lora_" in n for n in names)}),
    "qlora-nf4": ({"lora": 8, "quantized_base": "nf4"}, 8, {"trained_numel": LORA_8_TRAINS,
                                                              "modules": lambda classes: "Linear4bit" in classes}),
    "head_only": ({"head_only": True}, 8, {"trained": ["lm_head.weight"]}),
    "drop_last": ({"drop_last": True}, 8, {"loader": lambda loader: loader["drop_last"] is True}),
    "workers2": ({"dataloader_num_workers": 2}, 8, {"loader": lambda loader: loader["num_workers"] == 2}),
}
# Your own model: a plain nn.Module with your loss_fn, on tuples of tensors.  The exported code trains it with that
# loss (the Trainer through compute_loss), adapters on the layers scalekit adapts (not peft's "all-linear", which
# would take the head too), and says it does not carry what is spelled for Transformers models.
OWN_MODEL = """
import torch


class BlocksLM(torch.nn.Module):
    def __init__(self, vocab=65, width=16):
        super().__init__()
        self.emb, self.head = torch.nn.Embedding(vocab, width), torch.nn.Linear(width, vocab)
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU())
                                          for _ in range(2))

    def forward(self, ids):
        h = self.emb(ids)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


def loss_fn(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())


torch.manual_seed(0)
model = BlocksLM()
train_dataset = [(torch.randint(0, 65, (16,)), torch.randint(0, 65, (16,))) for _ in range(samples)]
"""
OWN_ALL = ["blocks.0.0.bias", "blocks.0.0.weight", "blocks.1.0.bias", "blocks.1.0.weight", "emb.weight", "head.bias",
           "head.weight"]
OWN_CASES = {
    "own-baseline": ({}, {"trained": OWN_ALL}),
    "own-bf16-accum2": ({"bf16": True, "grad_accum": 2}, {"mixed_precision": "bf16", "accumulation": 2,
                                                          "autocast": ["bfloat16"]}),
    "own-lora4": ({"lora": 4}, {"trained_numel": 2 * 4 * (16 + 16),  # the two block layers only
                                "trained": lambda names: len(names) == 4 and all(".lora_" in n for n in names)}),
    # both blocks under torch.utils.checkpoint: 2 calls a forward, and the recomputations do not call it again
    "own-checkpointing": ({"checkpointing": 1}, {"checkpoint_calls": lambda calls: calls > 0 and calls % 2 == 0,
                                                 "trained": OWN_ALL}),
}


def own_config(name: str) -> RunConfig:
    space: dict = {"samples": 8}
    exec(OWN_MODEL, space)
    return RunConfig(model=space["BlocksLM"], dataset=space["train_dataset"], loss_fn=space["loss_fn"], batch_size=8,
                     tokens_per_sample=16, toggles=OWN_CASES[name][0], steps=2, warmup_steps=0, lr=1e-3)


# facts only some targets show, and those targets: an Accelerator's precision (Lightning has none: autocast's dtype
# shows its precision) and the accumulation an Accelerator or Lightning's Trainer counts (the Trainer accumulates
# itself: its step count says so)
TARGET_FACTS = {"mixed_precision": ("hf", "accelerate"), "accumulation": ("accelerate", "lightning")}


def config(name: str) -> RunConfig:
    toggles, batch, _ = CASES[name]
    # device 'auto', as `scalekit export` writes it; steps: Lightning's max_steps (its code stops there)
    return RunConfig(toggles=toggles, batch_size=batch, steps=2, warmup_steps=0, lr=1e-3)


@pytest.fixture(scope="module")
def ran() -> dict:
    """target -> case id -> what the run did; every installed target's cases run in one process, one after another."""
    targets = [t for t, library in LIBRARIES.items() if importlib.util.find_spec(library) is not None]
    cases = [{"id": f"{target}/{name}", "code": export_code(config(name), target), "samples": CASES[name][1]}
             for target in targets for name in CASES]
    cases += [{"id": f"{target}/{name}", "code": export_code(own_config(name), target), "samples": 8,
               "prelude": OWN_MODEL} for target in targets for name in OWN_CASES]
    cases.insert(1, {"id": "probe/network", "code": NETWORK_PROBE, "samples": 1})  # between two real cases
    proc = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "run_exported.py")], input=json.dumps(cases),
                          capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    results = [json.loads(line[7:]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and len(results) == len(cases), proc.stderr[-3000:]
    out: dict = {}
    for r in results:
        target, name = r["id"].split("/")
        out.setdefault(target, {})[name] = r
    return out


# code that reaches for the network: the runner must refuse the connection and report it
NETWORK_PROBE = """
import socket
try:
    socket.create_connection(("127.0.0.1", 9), timeout=1)
except OSError as refused:
    assert "no network connection may be attempted" in str(refused), refused
"""


def test_the_runner_refuses_and_reports_a_network_connection(ran):
    assert ran["probe"]["network"]["network_attempts"] == ["('127.0.0.1', 9)"]
    # each case reports its own attempts: the case run after the probe, and every other, none
    assert all(f["network_attempts"] == [] for t in ran if t != "probe" for f in ran[t].values())


def facts_of(ran: dict, target: str, case: str) -> dict:
    """What the exported code of `case` did in `target` (skipped where the framework is not installed)."""
    if importlib.util.find_spec(LIBRARIES[target]) is None:
        pytest.skip(f"{LIBRARIES[target]} is not installed: its exported code is only compiled here "
                    f"(tests/hf/test_hf_arguments.py)")
    facts = ran[target][case]
    assert "error" not in facts, facts.get("error")
    assert facts["network_attempts"] == [], facts["network_attempts"]  # tests/run_exported.py refuses them
    assert facts["steps"] == STEPS[target], facts  # with accumulation too: one step of k micro-batches an epoch
    return facts


def assert_shows(facts: dict, target: str, shows: dict) -> None:
    for key, expected in shows.items():
        if target in TARGET_FACTS.get(key, (target,)):
            assert (expected(facts[key]) if callable(expected) else facts[key] == expected), (key, facts[key], facts)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("target", list(LIBRARIES))
def test_the_exported_code_runs_here_and_does_what_its_toggles_say(ran, target, case):
    facts = facts_of(ran, target, case)
    toggles, batch, shows = CASES[case]
    assert facts["loader"]["batch_size"] == batch // toggles.get("grad_accum", 1)
    assert_shows(facts, target, shows)


@pytest.mark.parametrize("case", list(OWN_CASES))
@pytest.mark.parametrize("target", list(LIBRARIES))
def test_the_code_exported_for_your_own_model_trains_it_with_your_loss(ran, target, case):
    facts = facts_of(ran, target, case)
    assert "BlocksLM" in facts["modules"]
    assert_shows(facts, target, OWN_CASES[case][1])


def test_the_code_exported_for_your_own_model_names_what_it_leaves_out():
    code = export_code(own_config("own-checkpointing"), "hf")
    assert "# Assumes `model` (your BlocksLM" in code and "AutoModelForCausalLM" not in code
    assert "for i, block in enumerate(model.get_submodule('blocks')):" in code and "# not carried" not in code
    assert "gradient_checkpointing" not in code and "remove_unused_columns=False" in code
    qlora = export_code(dataclasses.replace(own_config("own-lora4"), toggles={"lora": 4, "quantized_base": "nf4"}), "hf")
    # the quantized base is carried as the bitsandbytes swap scalekit makes (tests/hf/test_export_own_model.py runs it)
    assert "# not carried" not in qlora and "bnb.nn.Linear4bit(" in qlora and "from_pretrained" not in qlora \
        and "get_peft_model" in qlora
    sdpa_free = export_code(own_config("own-baseline"), "hf")
    assert "attn_implementation" not in sdpa_free  # sdpa's "eager" when off is a Transformers model's switch
    by_lambda = dataclasses.replace(own_config("own-baseline"), model=lambda: own_config("own-baseline").model())
    assert "# Assumes `model` (your model, built as scalekit built it)" in export_code(by_lambda, "hf")
    lora = export_code(own_config("own-lora4"), "accelerate")
    assert "target_modules=['blocks.0.0', 'blocks.1.0']" in lora and "def training_function(model):" in lora
    space: dict = {"samples": 8}
    exec(OWN_MODEL, space)

    class NotOnMeta(space["BlocksLM"]):  # reads a value as it is built: no meta-device build
        def __init__(self):
            super().__init__()
            self.scale = torch.ones(1).sum().item()

    shy = export_code(dataclasses.replace(own_config("own-lora4"), model=NotOnMeta), "hf")
    assert 'target_modules="all-linear"' in shy
    assert "# note: your model could not be built on the meta device" in shy and "RunConfig.adapter_targets" in shy
    for target in LIBRARIES:
        code = export_code(own_config("own-lora4"), target)
        compile(code, f"{target}.py", "exec")
        assert ("loss_fn(self.model, batch)" if target == "lightning" else "loss_fn(model,") in code
