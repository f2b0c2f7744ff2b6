"""float8: unavailable on the CPU (and on GPUs without float8 tensor cores) with the reason; its numerics, emulated
on the CPU, train within 2% of bf16's loss step by step."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from scalekit import RunConfig, ToggleUnavailable, run
from scalekit.models import GPT, PRESETS
from scalekit.toggles import TOGGLES
from scalekit.toggles.float8 import to_float8
from tests.helpers import CPU

pytest.importorskip("torchao")
pytestmark = pytest.mark.filterwarnings("ignore")
BOUND = 0.02  # emulated float8 against bf16: relative loss difference at every step of a short training


def test_unavailable_on_the_cpu_and_without_float8_tensor_cores():
    ok, why = TOGGLES["float8"].available(CPU)
    assert not ok and "CUDA GPU" in why and "\n" not in why
    a100 = dataclasses.replace(CPU, device_type="cuda", device_name="NVIDIA A100", capability=(8, 0))
    ok, why = TOGGLES["float8"].available(a100)
    assert not ok and "NVIDIA A100" in why and "8.9" in why
    h100 = dataclasses.replace(a100, device_name="NVIDIA H100", capability=(9, 0))
    assert TOGGLES["float8"].available(h100) == (True, "")
    with pytest.raises(ToggleUnavailable, match="float8"):
        run(RunConfig(preset="tiny", device="cpu", steps=1, warmup_steps=0, toggles={"float8": True}))


def test_emulated_float8_trains_within_the_bound_of_bf16():
    torch.manual_seed(0)
    bf16 = GPT(PRESETS["tiny"].gpt_config())
    f8 = copy.deepcopy(bf16)
    assert to_float8(f8, emulate=True, device_type="cpu") == 4 * bf16.config.n_layer
    assert type(f8.transformer.h[0].mlp.c_fc).__name__ == "Float8Linear"
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (bf16, f8)]
    g = torch.Generator().manual_seed(0)
    for _ in range(6):
        xy = torch.randint(0, 65, (4, 65), generator=g)
        losses = []
        for model, opt in zip((bf16, f8), opts, strict=True):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(xy[:, :-1], xy[:, 1:])[1]
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        assert abs(losses[1] - losses[0]) <= BOUND * losses[0], losses
    assert losses[1] != losses[0]  # float8's rounding is really there
