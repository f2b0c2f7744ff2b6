"""DDP, FSDP2 and FSDP2 + CPU offload over 2 gloo ranks train exactly like one process with the whole batch."""

from __future__ import annotations

import contextlib
import gc
import sys

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import scalekit
from scalekit.distributed import runtime as distributed
from scalekit.distributed.runtime import DistributedRunResult
from scalekit.launch import launch, launch_run
from scalekit.toggles import needs_process_group
from scalekit.training.build import build, train_step
from scalekit.training.results import RunResult, StepRecord
from tests.forking import no_process_left_behind  # noqa: F401 - the same deadline and cleanup here
from tests.helpers import Regressor, mse_loss, regression_batch, tiny

CPU = scalekit.detect("cpu")
STEPS = 3
BATCH = 8  # the global batch: each of 2 ranks trains on 4 sequences


def train(cfg, grad_accum_steps: int = 1, count_allreduces: bool = False, no_sync: bool = True):
    """Losses (averaged over ranks), full parameters and the inputs seen after STEPS steps of `cfg`."""
    cfg = cfg.resolve(CPU)
    calls = []
    with contextlib.ExitStack() as stack:
        group = distributed.setup(CPU, stack, cfg.batch_size) if needs_process_group(cfg.toggles) else None
        ctx = build(cfg, CPU, stack)
        ctx.grad_accum_steps = grad_accum_steps  # what the grad_accum toggle sets
        if not no_sync:
            ctx.no_sync = None  # all-reduce after every micro-batch
        if count_allreduces:
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            def counting(state, bucket):
                calls.append(bucket.index())
                return allreduce_hook(state, bucket)

            ctx.model.register_comm_hook(None, counting)
        losses, inputs = [], []
        for _ in range(STEPS):
            batch = next(ctx.batches)
            inputs.append(batch[0].clone())
            loss = train_step(ctx, batch).detach()
            if group is not None:
                dist.all_reduce(loss)
                loss /= group.world_size
            losses.append(loss.item())
        params = {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
                  for name, p in ctx.base_model.named_parameters()}
        del ctx
    # DDP re-buckets after its first backward, but every backward that all-reduces does bucket 0 once
    return losses, params, calls.count(0), inputs


CASES = {  # name: (config, micro-batches per step, no_sync)
    "ddp": (dict(toggles=["ddp"]), 1, True),
    "ddp + accumulation (no_sync)": (dict(toggles=["ddp"]), 2, True),
    "ddp + accumulation (always sync)": (dict(toggles=["ddp"]), 2, False),
    "fsdp": (dict(toggles=["fsdp"]), 1, True),
    "fsdp + cpu_offload": (dict(toggles=["fsdp", "cpu_offload"]), 1, True),
}


def _all_cases():
    dist.init_process_group("gloo")  # the engine joins a group that is already there
    out = {name: train(tiny(batch_size=BATCH, **kw), accum, count_allreduces="ddp" in kw["toggles"], no_sync=sync)
           for name, (kw, accum, sync) in CASES.items()}
    dist.destroy_process_group()
    return out


@pytest.fixture(scope="module")
def two_ranks():
    return launch(_all_cases, nprocs=2)


@pytest.fixture(scope="module")
def one_process():
    return train(tiny(batch_size=BATCH))


@pytest.mark.parametrize("case", CASES)
def test_two_ranks_with_half_the_batch_each_match_one_process_with_the_whole_batch(case, two_ranks, one_process):
    ref_losses, ref_params, _, ref_inputs = one_process
    # each rank trained on its own half of every global batch, the two halves making the whole
    for step, whole in enumerate(ref_inputs):
        halves = [rank_out[case][3][step] for rank_out in two_ranks]
        assert [h.shape[0] for h in halves] == [BATCH // 2] * 2
        assert torch.equal(torch.cat(halves), whole)
    for rank_out in two_ranks:  # every rank ends with the same full model
        losses, params, _, _ = rank_out[case]
        assert losses == pytest.approx(ref_losses, abs=1e-5)
        assert params.keys() == ref_params.keys()
        for name in ref_params:
            torch.testing.assert_close(params[name], ref_params[name], atol=1e-5, rtol=1e-4, msg=name)
    # and training moved the weights: the comparison is not between two untouched models
    with contextlib.ExitStack() as stack:
        start = build(tiny(batch_size=BATCH).resolve(CPU), CPU, stack).base_model
        moved = max((p - ref_params[n]).abs().max().item() for n, p in start.named_parameters())
    assert moved > 1e-3


def test_accumulation_skips_the_all_reduce_on_all_but_the_last_micro_step(two_ranks):
    synced_backwards = {name: out[2] for name, out in two_ranks[0].items() if name.startswith("ddp")}
    assert synced_backwards == {"ddp": STEPS,
                                "ddp + accumulation (no_sync)": STEPS,  # 2 micro-batches, 1 all-reduce
                                "ddp + accumulation (always sync)": 2 * STEPS}


def test_ddp_and_fsdp_runs_aggregate_over_ranks():
    cfg = tiny(batch_size=BATCH, steps=4, toggles=["fsdp"])
    result = launch_run(cfg, nprocs=2)
    single = scalekit.run(tiny(batch_size=BATCH, steps=4))
    assert isinstance(result, DistributedRunResult) and result.status == "ok"
    assert result.world_size == 2 and [r["rank"] for r in result.per_rank] == [0, 1]
    assert result.tokens_per_step == single.tokens_per_step  # the global batch, split over ranks
    assert result.tokens_per_s == pytest.approx(sum(r["tokens_per_s"] for r in result.per_rank))
    assert all(r["peak_mem_bytes"] for r in result.per_rank)
    assert result.peak_mem_bytes == max(r["peak_mem_bytes"] for r in result.per_rank)
    assert [s for s, _ in result.losses] == [s for s, _ in single.losses]
    assert [v for _, v in result.losses] == pytest.approx([v for _, v in single.losses], abs=1e-5)
    assert "2 ranks (gloo)" in scalekit.compare([result]).loc[0, "note"]


def test_a_3d_mesh_counts_each_token_once_per_data_parallel_group(monkeypatch):
    """8 ranks as a (pipeline 2, data parallel 2, tensor parallel 2) mesh, their gathered figures scripted: the 4
    ranks of each data-parallel group (2 stages × 2 tensor-parallel ranks) process the same 256 of 512 tokens."""
    model_flops = 8e9  # the model's FLOPs for the whole batch: each rank does 1/8 of them
    step_s = [0.10, 0.11, 0.09, 0.10, 0.20, 0.19, 0.21, 0.20]  # ranks 2-3 and 6-7 are the second group's
    rows = [dict(rank=r, tokens_per_s=256 / s, tokens_per_s_wall=200 / s, step_ms=s * 1e3, peak_mem_bytes=1,
                 mfu=model_flops / 8 / s / 1e12, final_loss=3.0, losses=[(0, 3.0)], status="ok",
                 data_parallel_index=r // 2 % 2, tokens_per_step=256, peak_tflops=1.0, step_tokens=[256])
             for r, s in enumerate(step_s)]
    monkeypatch.setattr(distributed.dist, "all_gather_object", lambda out, mine: out.__setitem__(slice(None), rows))
    mine = RunResult(label="3-D", config={}, tokens_per_step=256, flops_per_step=model_flops / 8, losses=[(0, 3.0)],
                     steps=[StepRecord(step=0, warmup=False, step_ms=100.0, tokens_per_s=2560.0, loss=3.0,
                                       mem_bytes=None, tokens=256)])
    out = distributed.aggregate(distributed.Ranks(0, 8, "gloo", False), mine, data_parallel=(0, 2))
    groups = [[0, 1, 4, 5], [2, 3, 6, 7]]
    rate = sum(sum(256 / step_s[r] for r in g) / 4 for g in groups)  # each group's mean rate, once
    assert out.tokens_per_step == 512 and out.flops_per_step == model_flops
    assert out.tokens_per_s == pytest.approx(rate)  # not the 8 ranks' sum, 4× as much
    assert out.tokens_per_s_wall == pytest.approx(sum(sum(200 / step_s[r] for r in g) / 4 for g in groups))
    assert out.steps[0].tokens == 512 and out.steps[0].tokens_per_s == pytest.approx(5120)
    assert out.mfu == pytest.approx(model_flops / 512 * rate / 8e12)
    assert out.mfu == pytest.approx(sum(r["mfu"] for r in rows) / 8)
    assert "batch_size/2 per rank: tokens counted once per data-parallel group of 4 rank(s)" in out.notes[-1]
    assert "summed over 2 group(s)" in out.notes[-1] and "MFU against the peak of all 8 ranks" in out.notes[-1]


def _ddp_alive_when_the_group_is_destroyed(fail_at_call):
    """Count live DDP models at the moment the engine destroys the group it created."""
    seen = []
    real = dist.destroy_process_group

    def spy(*args, **kwargs):
        gc.collect()
        seen.append(sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects()))
        return real(*args, **kwargs)

    dist.destroy_process_group = spy
    calls = []

    def loss_fn(model, batch):
        calls.append(1)
        if len(calls) == fail_at_call:
            raise RuntimeError("loss blew up")
        return mse_loss(model, batch)

    cfg = tiny(model=Regressor, batch_fn=regression_batch, loss_fn=loss_fn, toggles=["ddp"], batch_size=BATCH)
    try:
        status = scalekit.run(cfg).status
    except RuntimeError as exc:
        status = str(exc)
    return seen, status


@pytest.mark.parametrize("fail_at_call,status", [(0, "ok"), (3, "loss blew up")])
def test_the_ddp_model_is_released_before_the_process_group_is_destroyed(fail_at_call, status):
    for seen, got in launch(_ddp_alive_when_the_group_is_destroyed, fail_at_call, nprocs=2):
        assert got == status
        assert seen == [0]  # destroyed once, with no DDP model alive (also when the run failed)


def _uneven():
    return scalekit.run(tiny(batch_size=7, toggles=["ddp"]))


def test_a_batch_that_does_not_split_over_the_ranks_is_a_config_error():
    with pytest.raises(Exception, match=r"RunConfig.batch_size \(7\) must be divisible by the number of ranks \(2\)"):
        launch(_uneven, nprocs=2)


class FakeDeepSpeedEngine(torch.nn.Module):
    """Stands in for DeepSpeed's engine on a CPU: plain backward and step, every call recorded."""

    def __init__(self, model, optimizer):
        super().__init__()
        self.module, self.optimizer, self.calls = model, optimizer, []

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def set_gradient_accumulation_boundary(self, is_boundary):
        self.calls.append(("boundary", is_boundary))

    def backward(self, loss):
        self.calls.append(("backward", None))
        loss.backward()

    def step(self):
        self.calls.append(("step", None))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def destroy(self):
        self.calls.append(("destroy", None))


def test_deepspeed_glue_routes_backward_and_step_through_the_engine_cpu_proxy(monkeypatch):
    """DeepSpeed itself needs a GPU; this checks scalekit's side of it: one engine.backward per micro-batch,
    the last one marked as the accumulation boundary, one engine.step per step, the same update as plain."""
    import types

    from scalekit.toggles import TOGGLES
    from scalekit.toggles.deepspeed import ds_config

    made = {}

    def initialize(model, optimizer, config):
        made["config"] = config
        made["engine"] = FakeDeepSpeedEngine(model, optimizer)
        return made["engine"], optimizer, None, None

    monkeypatch.setitem(sys.modules, "deepspeed", types.SimpleNamespace(initialize=initialize))
    # one process stands in for the ranks the toggle needs: the build's availability check is told so
    monkeypatch.setattr(TOGGLES["deepspeed"], "choice_available", lambda hw, value=True: (True, ""))
    ds_cfg = tiny(batch_size=BATCH, toggles={"deepspeed": "zero3-offload", "grad_accum": 2}).resolve(CPU)
    with contextlib.ExitStack() as stack:
        ctx = build(ds_cfg, CPU, stack)
        losses = [train_step(ctx, next(ctx.batches)).item() for _ in range(STEPS)]
        params = {n: p.detach().clone() for n, p in ctx.base_model.named_parameters()}
        calls = made["engine"].calls
    assert calls[-1] == ("destroy", None)  # DeepSpeed's teardown ran with the run's end
    per_step = [("boundary", False), ("backward", None), ("boundary", True), ("backward", None), ("step", None)]
    assert calls[:-1] == per_step * STEPS
    ref_losses, ref_params, _, _ = train(tiny(batch_size=BATCH))
    assert losses == pytest.approx(ref_losses, abs=1e-5)
    for name, p in ref_params.items():
        torch.testing.assert_close(params[name], p, atol=1e-5, rtol=1e-4)
    zero = made["config"]["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_param"]["device"] == zero["offload_optimizer"]["device"] == "cpu"
    assert made["config"]["train_micro_batch_size_per_gpu"] == BATCH // 2  # one rank, 2 micro-batches
    assert "offload_optimizer" not in ds_config("zero1", 4, 2, False)["zero_optimization"]
