"""scalekit.estimate against measurement: the peak within 15% on CPU (10% on GPU), the parts exactly."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from scalekit import ConfigError, RunConfig, estimate, run
from scalekit.toggles import TOGGLES
from tests.helpers import (
    ConvNet,
    NanoStyleGPT,
    Regressor,
    built,
    classify_loss,
    image_batch,
    mse_loss,
    nano_loss,
    regression_batch,
    token_batch,
)

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
    ("small-muon", dict(SMALL, toggles={"optim": "muon"})),
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
    def reads_a_value(model, batch):  # Python control flow on a tensor's value: fake tensors have none
        loss = mse_loss(model, batch)
        return loss * 2 if loss.item() > 0 else loss

    with pytest.raises(ConfigError, match="could not trace one training step of your model.*measured breakdown"):
        estimate(RunConfig(model=Regressor, batch_fn=regression_batch, loss_fn=reads_a_value, device="cpu"))
    with pytest.raises(ConfigError, match="must divide batch_size"):
        estimate(RunConfig(preset="tiny", batch_size=8, toggles={"grad_accum": 3}))
    with pytest.raises(ConfigError, match="'cpu' or 'cuda'"):
        estimate(RunConfig(preset="tiny"), device="tpu")


USER_MODELS = {  # name: (model, batch_fn, loss_fn, batch_size)
    "nanogpt-style": (NanoStyleGPT, token_batch, nano_loss, 16),
    "mlp": (Regressor, regression_batch, mse_loss, 64),
    "convnet": (ConvNet, image_batch, classify_loss, 16),
}
USER_TOGGLES = {"baseline": {}, "bf16": {"bf16": True}, "checkpointing": {"checkpointing": True},
                "grad_accum": {"grad_accum": 4}, "adamw_8bit": {"optim": "adamw_bnb_8bit"},
                "together": {"bf16": True, "checkpointing": 1, "grad_accum": 2}}


@pytest.mark.parametrize("toggles", list(USER_TOGGLES.values()), ids=list(USER_TOGGLES))
@pytest.mark.parametrize("name", list(USER_MODELS))
def test_planned_peak_of_a_users_model_is_within_15_percent_of_measured_on_cpu(name, toggles):
    model, batch_fn, loss_fn, batch = USER_MODELS[name]
    cfg = RunConfig(model=model, batch_fn=batch_fn, loss_fn=loss_fn, batch_size=batch, toggles=toggles,
                    steps=1, warmup_steps=0, device="cpu")
    planned = estimate(cfg)
    result = run(cfg)
    error = (planned.peak_bytes - result.peak_mem_bytes) / result.peak_mem_bytes
    assert abs(error) < 0.15, f"planned {planned.peak_bytes:,} vs measured {result.peak_mem_bytes:,}: {error:+.1%}"
    assert (planned.params_bytes, planned.grads_bytes, planned.optimizer_state_bytes) == \
        (result.params_bytes, result.grads_bytes, result.optimizer_state_bytes)
    assert planned.method.startswith("traced")


def test_a_users_model_is_planned_without_allocating_its_weights():
    import psutil

    class Wide(torch.nn.Module):  # 4 GiB of fp32 weights if they were real
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Linear(16384, 16384) for _ in range(4)])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    rss = psutil.Process().memory_info().rss
    plan = estimate(RunConfig(model=Wide, batch_fn=lambda b, d: torch.randn(b, 16384, device=d),
                              loss_fn=lambda m, x: m(x).square().mean(), batch_size=2, device="cpu"))
    assert plan.params_bytes == 4 * (16384 * 16384 + 16384) * 4
    assert plan.optimizer_state_bytes >= 2 * plan.params_bytes
    assert psutil.Process().memory_info().rss - rss < 2**30  # nothing like 4 GiB (+ 12 GiB of state) allocated


def test_every_toggle_is_planned_or_named_in_a_note():
    for toggle in TOGGLES.values():
        assert toggle.planned or toggle.plan_note, f"the planner says nothing about {toggle.name!r}"
    for name, text in ((t.name, t.plan_note) for t in TOGGLES.values() if t.plan_note):
        toggle = TOGGLES[name]
        toggles = [name] if toggle.choices is None else {name: True}
        if toggle.changes_weights:  # quantize: no training run takes it, so no plan of one can note it
            with pytest.raises(ConfigError, match="generation"):
                RunConfig(preset="tiny", toggles=toggles, eval_every=1)
            continue
        # a generation-only toggle acts on a training run's evaluation: it comes with eval_every
        evaluation = {} if "train" in toggle.loops else {"eval_every": 5}
        plan = estimate(RunConfig(preset="tiny", toggles=toggles, **evaluation), device="cuda")
        assert text in plan.notes


def test_a_pipeline_stage_is_planned_with_the_micro_batches_its_schedule_keeps_in_flight():
    from scalekit.models.pipeline import in_flight
    from scalekit.plan.estimate import Estimate
    from scalekit.plan.ranks import LOGITS_COPIES, per_rank
    from scalekit.toggles import plan_facts

    # torch's 1F1B runs min(stages - s, micro-batches) forwards on stage s before its first backward, GPipe all of
    # them; interleaved counts a forward through one of a rank's 2 stages as half a micro-batch through its blocks
    assert in_flight("1f1b", 2, 4).first == (2, 1) and in_flight("1f1b", 4, 8).first == (4, 3, 2, 1)
    assert in_flight("1f1b", 2, 4).later == (2, 1) and in_flight("1f1b", 2, 2).later == (1, 1)
    assert in_flight("gpipe", 2, 4).first == (4, 4) and in_flight("gpipe", 2, 4).later == (3, 3)
    assert in_flight("interleaved", 2, 4).first == (2.5, 1.5) and in_flight("1f1b", 2, 1).later == (0, 0)
    assert (in_flight("1f1b", 2, 4).head_first, in_flight("gpipe", 2, 4).head_first) == (1, 4)
    # a traced step whose forward keeps 8 MB in its blocks and 0.4 MB of log-probabilities (weights left out)
    blocks, logits = 8_000_000, 400_000
    single = Estimate(label="traced", params_bytes=0, grads_bytes=0, optimizer_state_bytes=0, activations_bytes=0,
                      peak_bytes=blocks + LOGITS_COPIES * logits, saved_activations_bytes=blocks + logits,
                      flops_per_step=None, hardware_flops_per_step=None, n_params=0, logits_bytes=logits,
                      method="traced: one step on fake tensors")
    plans = {schedule: per_rank(single, plan_facts({"pipeline_parallel": schedule}, 2, (2, 1, 1)), 2, True)
             for schedule in ("1f1b", "gpipe")}
    stage = blocks // 2  # each stage's blocks, of all 4 micro-batches
    # 1F1B: stage 0 holds 2 of the 4 micro-batches, the last 1 and its head's copies of one micro-batch's logits
    assert plans["1f1b"].stage_peaks_bytes == [stage * 2 // 4, stage // 4 + logits * LOGITS_COPIES // 4]
    assert plans["1f1b"].peak_bytes == stage // 2  # the first stage's: the plan is the highest rank's
    # GPipe: every micro-batch on both stages; the last adds the head's log-probabilities of all of them
    assert plans["gpipe"].stage_peaks_bytes == [stage, stage + logits * (4 + LOGITS_COPIES - 1) // 4]
    assert any("the plan is the ranks of the pipeline's stage 0" in n for n in plans["1f1b"].notes)


def test_the_gpts_analytic_pipeline_plan_keeps_the_micro_batches_its_schedule_keeps():
    def plan(schedule):
        cfg = RunConfig(preset="tiny", batch_size=8, toggles={"pipeline_parallel": schedule})
        return estimate(cfg, device="cpu", world_size=2).activations_bytes

    # GPipe holds all 4 micro-batches as its first backward begins; 1F1B's first stage 2 of them (its stages)
    assert plan("1f1b/4") < plan("gpipe/4")
    assert plan("1f1b/2") == plan("gpipe/2")  # 2 micro-batches on 2 stages: the first stage holds both either way


@pytest.mark.parametrize("user_model", [False, True], ids=["gpt", "user model"])
def test_runs_spread_over_ranks_are_planned_per_rank(user_model):
    cfg = dict(model=NanoStyleGPT, batch_fn=token_batch, loss_fn=nano_loss) if user_model else dict(preset="small")
    one = estimate(RunConfig(batch_size=16, **cfg), device="cuda")
    half = estimate(RunConfig(batch_size=8, **cfg), device="cuda")  # one rank's slice, as one process
    ddp = estimate(RunConfig(batch_size=16, toggles=["ddp"], **cfg), device="cuda", world_size=2)
    assert ddp.world_size == 2 and ddp.params_bytes == one.params_bytes
    assert ddp.peak_bytes == half.peak_bytes + half.grads_bytes  # plus DDP's gradient buckets
    fsdp = estimate(RunConfig(batch_size=16, toggles=["fsdp"], **cfg), device="cuda", world_size=4)
    quarter = estimate(RunConfig(batch_size=4, **cfg), device="cuda")
    assert fsdp.params_bytes == -(-quarter.params_bytes // 4) and fsdp.grads_bytes == -(-quarter.grads_bytes // 4)
    assert fsdp.peak_bytes < quarter.peak_bytes and any("fsdp: 1/4" in n for n in fsdp.notes)
    offload = estimate(RunConfig(batch_size=16, toggles=["fsdp", "cpu_offload"], **cfg), device="cuda",
                       world_size=4)
    assert offload.params_bytes == 0 and offload.host_bytes > 0 and offload.peak_bytes < fsdp.peak_bytes
    zero1 = estimate(RunConfig(batch_size=16, toggles={"deepspeed": "zero1"}, **cfg), device="cuda", world_size=2)
    assert zero1.params_bytes == half.params_bytes and zero1.optimizer_state_bytes == \
        -(-half.optimizer_state_bytes // 2)
    with pytest.raises(ConfigError, match="divisible by the number of ranks"):
        estimate(RunConfig(batch_size=6, toggles=["ddp"], **cfg), device="cuda", world_size=4)


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
