"""Weights saved from a compiled model load into a plain one, exactly, without `_orig_mod.` in the file."""

from __future__ import annotations

import os

import pytest
import torch

from scalekit.models import GPT, PRESETS
from scalekit.models import weight_files as checkpoint


@pytest.mark.slow
def test_compiled_model_round_trip_is_exact_and_clean(tmp_path):
    torch.manual_seed(0)
    model = GPT(PRESETS["tiny"].gpt_config())
    # torch.compile's wrapper is what renames the keys, whichever backend it lowers to: dynamo's own (no C++
    # compile; inductor's code is tested against eager in tests/toggles/test_compile.py)
    compiled = torch.compile(model, backend="eager")
    idx = torch.randint(0, 65, (2, 16))
    with torch.no_grad():
        compiled(idx)  # compile really ran (one inference graph: the trap is the same as after training)
    assert all(k.startswith("_orig_mod.") for k in compiled.state_dict())  # the trap
    path = tmp_path / "weights.pt"
    checkpoint.save(compiled, path)
    saved = torch.load(path, weights_only=True)
    assert not any("_orig_mod" in k for k in saved)
    fresh = GPT(PRESETS["tiny"].gpt_config())
    checkpoint.load(fresh, path)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(fresh.state_dict()[k], v, rtol=0, atol=0)
    torch.testing.assert_close(fresh(idx)[0], model(idx)[0], rtol=0, atol=0)
    assert os.listdir(tmp_path) == ["weights.pt"]  # no temporary file left behind


def test_a_failed_save_leaves_no_file(tmp_path, monkeypatch):
    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(OSError):
        checkpoint.save(torch.nn.Linear(2, 2), tmp_path / "w.pt")
    assert os.listdir(tmp_path) == []


def test_unwrap_sees_through_wrappers():
    inner = torch.nn.Linear(2, 2)

    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.module = inner

    assert checkpoint.unwrap(Wrapper()) is inner


def test_a_save_to_a_full_disk_names_the_path_and_says_no_space_left(tmp_path):
    from tests.helpers import small_mount

    with small_mount(tmp_path / "disk", size="256k") as disk:
        path = disk / "w.pt"
        with pytest.raises(OSError) as caught:
            checkpoint.save(torch.nn.Linear(512, 512), path)  # 1 MB of weights
        message = str(caught.value)
        assert str(path) in message and "no space left" in message, message
        assert "inline_container" not in message and "\n" not in message
        assert caught.value.errno == 28 and os.listdir(disk) == []  # ENOSPC, and no temporary file left
