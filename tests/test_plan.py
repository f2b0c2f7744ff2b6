"""scalekit.estimate against measurement: the peak within 15% on CPU (10% on GPU), the parts exactly."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from scalekit import ConfigError, RunConfig, estimate, run
from tests.helpers import Regressor, mse_loss, regression_batch
from tests.test_memory_toggles import built

SMALL = dict(preset="small", batch_size=8)
# (id, config): precision, attention, optimizer, accumulation and checkpointing, alone and together
CASES = [
    ("tiny", dict(preset="tiny")),
    ("small", dict(SMALL)),
    ("small-sdpa", dict(SMALL, toggles=["sdpa"])),
    ("small-bf16", dict(SMALL, toggles=["bf16"])),
    ("small-fp16-sdpa", dict(SMALL, toggles=["fp16", "sdpa"])),
    ("small-ckpt", dict(SMALL, toggles={"checkpointing": True})),
    ("small-ckpt-sequential", dict(SMALL, toggles={"checkpointing": "sequential"})),
    ("small-accum4", dict(SMALL, toggles={"grad_accum": 4})),
    ("small-adamw8bit", dict(SMALL, toggles={"optim": "adamw_bnb_8bit"})),
    ("small-adafactor-nice", dict(SMALL, toggles={"optim": "adafactor", "nice_numbers": True})),
    ("small-b2-foreach", dict(preset="small", batch_size=2, seq_len=32, toggles={"optim": "adamw_torch_foreach"})),
    ("small-all", dict(SMALL, toggles={"bf16": True, "checkpointing": 2, "grad_accum": 2, "optim": "lion_8bit"})),
]


def measured(config: dict, device: str = "cpu"):
    return run(RunConfig(device=device, steps=1, warmup_steps=0 if device == "cpu" else 1, **config))


@pytest.mark.parametrize("config", [c for _, c in CASES], ids=[i for i, _ in CASES])
def test_planned_peak_is_within_15_percent_of_measured_on_cpu(config):
    assert len(CASES) >= 8
    result = measured(config)
    planned = estimate(RunConfig(device="cpu", **config))
    error = (planned.peak_bytes - result.peak_mem_bytes) / result.peak_mem_bytes
    assert abs(error) < 0.15, f"planned {planned.peak_bytes:,} vs measured {result.peak_mem_bytes:,}: {error:+.1%}"
    # the three parts that do not depend on timing are predicted to the byte
    assert planned.params_bytes == result.params_bytes
    assert planned.grads_bytes == result.grads_bytes
    assert planned.optimizer_state_bytes == result.optimizer_state_bytes
    assert planned.activations_bytes == planned.peak_bytes - planned.params_bytes - planned.grads_bytes \
        - planned.optimizer_state_bytes


@pytest.mark.parametrize("toggles", [[], ["nice_numbers"], {"optim": "adamw_bnb_8bit"}])
def test_planned_flops_are_the_engines(toggles):
    cfg = RunConfig(preset="tiny", device="cpu", steps=1, warmup_steps=0, toggles=toggles, measure_memory=False)
    assert estimate(cfg).flops_per_step == run(cfg).flops_per_step


def test_recomputed_flops_are_counted_by_torch():
    # torchtitan's check: FLOPs counted with checkpointing minus without = the forward done again
    def counted(toggles) -> int:
        with built(RunConfig(preset="tiny", device="cpu", toggles=toggles)) as ctx:
            batch = next(ctx.batches)
            counter = FlopCounterMode(display=False)
            with counter:
                ctx.loss_fn(ctx.model, batch).backward()
            return counter.get_total_flops()

    for mode in (True, "sequential"):
        plan = estimate(RunConfig(preset="tiny", device="cpu", toggles={"checkpointing": mode}))
        assert counted({"checkpointing": mode}) - counted({}) == plan.hardware_flops_per_step - plan.flops_per_step
        assert plan.hardware_flops_per_step > plan.flops_per_step


def test_estimate_says_what_it_cannot_plan():
    with pytest.raises(ConfigError, match="built-in GPT"):
        estimate(RunConfig(model=Regressor, batch_fn=regression_batch, loss_fn=mse_loss))
    with pytest.raises(ConfigError, match="must divide batch_size"):
        estimate(RunConfig(preset="tiny", batch_size=8, toggles={"grad_accum": 3}))
    with pytest.raises(ConfigError, match="'cpu' or 'cuda'"):
        estimate(RunConfig(preset="tiny"), device="tpu")


def test_a_gpu_run_can_be_planned_on_a_laptop():
    plan = estimate(RunConfig(toggles=["bf16", "sdpa"]), device="cuda")  # 'auto' preset: gpt2-124m on a GPU
    assert plan.n_params == 124_439_808  # GPT-2 small: tied embedding and lm_head, 1024 positions
    assert plan.optimizer_state_bytes == 2 * plan.grads_bytes + 4 * 148  # two fp32 moments + step counters
    assert plan.peak_bytes > plan.params_bytes + plan.grads_bytes + plan.optimizer_state_bytes


def test_planner_follows_the_memory_levers():
    base = estimate(RunConfig(preset="small", device="cpu"))
    for toggles in (["bf16"], ["sdpa"], {"grad_accum": 4}, {"checkpointing": True}, {"optim": "adamw_bnb_8bit"}):
        assert estimate(RunConfig(preset="small", device="cpu", toggles=toggles)).peak_bytes < base.peak_bytes


GPU_CASES = [
    dict(preset="small", batch_size=32),
    dict(preset="medium", batch_size=16, toggles=["bf16", "sdpa"]),
    dict(preset="medium", batch_size=16, toggles={"checkpointing": True}),
    dict(preset="gpt2-124m", batch_size=4, data="shakespeare",
         toggles={"bf16": True, "sdpa": True, "optim": "adamw_torch_fused"}),
]


@pytest.mark.gpu
@pytest.mark.parametrize("config", GPU_CASES)
def test_planned_peak_is_within_10_percent_of_the_allocator_on_gpu(config):
    result = measured(config, device="cuda")
    planned = estimate(RunConfig(device="cuda", **config))
    error = (planned.peak_bytes - result.peak_mem_bytes) / result.peak_mem_bytes
    assert abs(error) < 0.10, f"planned {planned.peak_bytes:,} vs allocator {result.peak_mem_bytes:,}: {error:+.1%}"
    assert planned.params_bytes == result.params_bytes and planned.grads_bytes == result.grads_bytes
    torch.cuda.empty_cache()


@pytest.mark.gpu
def test_a_gpu_run_reports_the_allocators_breakdown():
    result = measured(dict(preset="tiny"), device="cuda")
    parts = result.memory_breakdown()
    assert parts and parts["peak"] == result.peak_mem_bytes and parts["grads"] > 0
    assert "allocator" in result.mem_source
