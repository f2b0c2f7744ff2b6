"""Nothing in the Transformers bridge reaches for the network: every socket connection is made to fail, and
the whole path runs (models from configs, scalekit runs, the planner, TrainingArguments in and out, the export,
a Trainer run with the callback)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers", reason="the Transformers bridge needs transformers installed")

WHOLE_PATH = r'''
import socket, tempfile
attempts = []

def refuse(*args, **kwargs):
    attempts.append(args[1:2] or args[:1])
    raise OSError("scalekit test: no network connection may be attempted")

socket.socket.connect = refuse
socket.socket.connect_ex = refuse
socket.create_connection = refuse

import scalekit, transformers
from scalekit import RunConfig
from scalekit.hf import CorpusDataset, ScalekitCallback, causal_lm, export_code

spec = causal_lm("llama", "tiny")
toggles = {"sdpa": True, "nice_numbers": True, "checkpointing": 1, "bf16": True}
result = scalekit.run(RunConfig(model=spec, toggles=toggles, steps=2, warmup_steps=1, device="cpu"))
assert result.ok, result.error
plan = scalekit.estimate(RunConfig(model=spec, device="cpu"))
args = transformers.TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=4, max_steps=3,
                                      use_cpu=True, logging_steps=1, report_to="none", save_strategy="no",
                                      disable_tqdm=True)
cfg = RunConfig.from_training_arguments(args, model=spec, steps=2, warmup_steps=0)
assert scalekit.run(cfg).ok
back = cfg.to_training_arguments()
code = export_code(cfg, "hf") + export_code(cfg, "accelerate") + export_code(cfg, "lightning")
callback = ScalekitCallback(warmup_steps=1)
transformers.Trainer(model=spec.build(), args=args, train_dataset=CorpusDataset(32), callbacks=[callback]).train()
assert callback.result.tokens_per_s > 0
print("attempts", len(attempts), attempts)
'''


def test_the_whole_path_attempts_no_network_connection():
    # HF_HUB_OFFLINE unset on purpose: the path must not need the Hub, not merely be told to stay off it
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    proc = subprocess.run([sys.executable, "-c", WHOLE_PATH], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "attempts 0 []"


def test_the_refusal_is_real():
    # the patched socket does refuse: a connection attempted under it fails and is counted
    code = WHOLE_PATH.split("import scalekit, transformers")[0] + (
        "try:\n    socket.create_connection(('127.0.0.1', 9))\nexcept OSError as e:\n    print('refused', e)\n"
        "print('attempts', len(attempts))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "refused scalekit test" in proc.stdout and proc.stdout.strip().endswith("attempts 1"), proc.stdout


def test_quiet_import_keeps_the_hub_offline_while_it_imports_and_restores_the_switch(monkeypatch):
    from huggingface_hub import constants

    from scalekit import optional

    seen = []

    def import_module(name):
        seen.append((name, constants.HF_HUB_OFFLINE))
        if name == "missing_library":
            raise ModuleNotFoundError(name)
        return name

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(optional.importlib, "import_module", import_module)
    assert optional.quiet_import("peft", device_type="cpu") == "peft"
    with pytest.raises(ModuleNotFoundError):
        optional.quiet_import("missing_library", device_type="cpu")
    assert seen == [("peft", True), ("missing_library", True)]
    assert constants.HF_HUB_OFFLINE is False  # put back, after a failed import too
