"""ZeRO-1/2 (scalekit's zero), tensor and pipeline parallelism over 2 gloo ranks train like one process.

Each case: 2 ranks, each with its share of the work, against 1 process with the whole batch, on the losses and
the full parameters after a few steps (fp32; the built-in GPT's tiny preset and, where the case says, a tiny
Llama built from its config).  One launch runs every 2-rank case; the 2-D mesh takes 4 ranks.
"""

from __future__ import annotations

import contextlib
import time

import pytest
import torch
import torch.distributed as dist

import scalekit
from scalekit.distributed import runtime as distributed
from scalekit.distributed.sharding import mesh_shape
from scalekit.errors import ConfigError
from scalekit.launch import LaunchError, launch
from scalekit.models.tensor_parallel import full_parameters
from scalekit.plan import estimate
from scalekit.toggles import needs_process_group
from scalekit.toggles.tensor_parallel import parse
from scalekit.training.build import build, probe_step_memory, step_tracker, train_step
from tests.forking import no_process_left_behind  # noqa: F401 - the same deadline and cleanup here
from tests.helpers import Regressor, tiny

CPU = scalekit.detect("cpu")
STEPS = 3
BATCH = 8

CASES = {  # name: toggles
    "zero1": {"zero": "zero1"},
    "zero2": {"zero": "zero2"},
    "zero1 + accumulation": {"zero": "zero1", "grad_accum": 2},
    "zero1, Hugging Face Llama": {"zero": "zero1"},
    "zero2, Hugging Face Llama": {"zero": "zero2"},
    "tensor_parallel": {"tensor_parallel": 2},
    "tensor_parallel + accumulation": {"tensor_parallel": 2, "grad_accum": 2},
    "tensor_parallel, Hugging Face Llama (its tp_plan)": {"tensor_parallel": 2},
    "tensor_parallel + sequence_parallel norms": {"tensor_parallel": "2,sequence_parallel"},
    "tensor_parallel + sequence_parallel norms, Hugging Face Llama": {"tensor_parallel": "2,sequence_parallel"},
    "2-D: fsdp + tensor_parallel": {"fsdp": True, "tensor_parallel": 2},
    "pipeline_parallel gpipe": {"pipeline_parallel": "gpipe"},
    "pipeline_parallel 1f1b, 2 micro-batches": {"pipeline_parallel": "1f1b/2"},
    "pipeline_parallel interleaved, small (4 stages on 2 ranks)": {"pipeline_parallel": "interleaved"},
}


def config(case: str, toggles: dict | None = None, **kw):
    """The case's run: the built-in GPT, or a tiny Llama built offline from its config."""
    if "Llama" in case:
        from scalekit.hf import causal_lm  # in the test: transformers stays out of collection

        return scalekit.RunConfig(model=causal_lm("llama", "tiny"), batch_size=BATCH, steps=STEPS, warmup_steps=0,
                                  device="cpu", toggles=toggles or {}, **kw)
    if "small" in case:
        kw["preset"] = "small"  # 4 blocks: 2 stages on each of 2 ranks
    return tiny(batch_size=BATCH, toggles=toggles or {}, **kw)
LADDER = {"ddp": ["ddp"], "zero1": {"zero": "zero1"}, "zero2": {"zero": "zero2"}, "fsdp (zero3)": ["fsdp"],
          "tensor_parallel": {"tensor_parallel": 2}, "pipeline_parallel": {"pipeline_parallel": "gpipe"},
          "pipeline_parallel 1f1b/4": {"pipeline_parallel": "1f1b/4"}}  # its first stage holds 2 of the 4


def train(cfg):
    """Losses (averaged over ranks), full parameters, this rank's optimizer state (values) and the last step's
    full gradients at each of STEPS steps of `cfg`."""
    return _train(cfg, peak=False)[0]


def train_and_peak(cfg):
    """train(cfg)'s figures, and this rank's peak memory over one more step, counted as the engine counts a
    rank's (engine._probe_cpu_memory: live tensors, a DTensor by its shard) once the figures are taken."""
    return _train(cfg, peak=True)


def one_step_peak(cfg) -> int:
    """This rank's peak memory as scalekit.run(steps=1) measures it: built, one step, then the counted one."""
    cfg = cfg.resolve(CPU)
    with contextlib.ExitStack() as stack:
        distributed.setup(CPU, stack, cfg.batch_size)
        ctx = build(cfg, CPU, stack)
        train_step(ctx, next(ctx.batches))
        return probe_step_memory(ctx, step_tracker(ctx, distributed.LocalTensorBytes))


def _train(cfg, peak: bool):
    cfg = cfg.resolve(CPU)
    with contextlib.ExitStack() as stack:
        group = distributed.setup(CPU, stack, cfg.batch_size) if needs_process_group(cfg.toggles) else None
        ctx = build(cfg, CPU, stack)
        losses, grads = [], []
        degree = parse(cfg.toggles["tensor_parallel"])[0] if "tensor_parallel" in cfg.toggles else 1
        # every step's gradients, full, as the optimizer is about to use them
        collecting = ctx.optimizer.register_step_pre_hook(
            lambda *_, model=ctx.base_model: grads.append(full_parameters(model, degree, grads=True)))
        for _ in range(STEPS):
            loss = train_step(ctx, next(ctx.batches)).detach()
            if group is not None:
                dist.all_reduce(loss)
                loss /= group.world_size
            losses.append(loss.item())
        # the weights this rank trains (under a pipeline with fsdp, an alias of a tied weight outside the rank's
        # stages keeps the parameter fsdp replaced: left out)
        live, named = {id(p) for p in ctx.model.parameters()}, dict(ctx.base_model.named_parameters())
        params = {n: t for n, t in full_parameters(ctx.base_model, degree).items() if id(named[n]) in live}
        state = sum(local(t).numel() for s in ctx.optimizer.state.values() for t in s.values()
                    if isinstance(t, torch.Tensor) and t.dim() > 0)  # (not Adam's step counters)
        measured = None
        if peak:  # (params are copies: the extra step changes none of the figures above)
            collecting.remove()
            measured = probe_step_memory(ctx, step_tracker(ctx, distributed.LocalTensorBytes))
        del ctx
    return (losses, params, state, grads), measured


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t  # a DTensor: this rank's shard


def ladder_run(toggles=None):
    """One measured step of the tiny GPT (an MFU against a peak of 1 TFLOP/s: the CPU's is not known)."""
    return tiny(batch_size=BATCH, steps=1, warmup_steps=0, peak_tflops=1.0, toggles=toggles or {})


def _all_cases():
    dist.init_process_group("gloo")
    out = {name: train(config(name, toggles)) for name, toggles in CASES.items()}
    # the engine's runs of the ladder, one step each: each rank's measured peak for the memory ladder (its per-rank
    # accounting), and the throughput figures gathered over the ranks
    out["runs"] = {name: scalekit.run(ladder_run(toggles)) for name, toggles in LADDER.items()}
    out["peaks"] = {name: run.per_rank[dist.get_rank()]["peak_mem_bytes"] for name, run in out["runs"].items()}
    dist.destroy_process_group()
    return out


@pytest.fixture(scope="module")
def two_ranks():
    return launch(_all_cases, nprocs=2)


@pytest.fixture(scope="module")
def one_process():
    return {"gpt": train(config("gpt")), "llama": train(config("Llama")), "small": train(config("small"))}


def close(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest difference relative to the tensor's scale."""
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


@pytest.mark.parametrize("case", CASES)
def test_each_mode_trains_like_one_process(case, one_process, two_ranks):  # one process first: the ranks
    # forked after it inherit transformers, imported once
    ref_losses, ref_params, ref_state, ref_grads = one_process[
        "llama" if "Llama" in case else "small" if "small" in case else "gpt"]
    for rank_out in two_ranks:
        losses, params, state, grads = rank_out[case]
        assert losses == pytest.approx(ref_losses, rel=1e-5)
        # every rank holds all of the model, or (pipeline) its stage's weights: compared where held
        for name in grads[0]:  # the first step's gradients (same weights), to 1e-5 of each tensor's scale
            assert close(grads[0][name], ref_grads[0][name]) < 1e-5, name
        for name in grads[-1]:  # the last's, after Adam has amplified rounding a little (below)
            assert close(grads[-1][name], ref_grads[-1][name]) < 1e-4, name
        for name in params:
            # Adam divides by sqrt(v): where a gradient is near zero, rounding differences of 1e-7 can move a
            # weight by up to lr; as DDP's test, plus that slack for one weight in thousands
            torch.testing.assert_close(params[name], ref_params[name], atol=5e-5, rtol=1e-4,
                                       msg=lambda m, name=name: f"{name}: {m}")
        # each rank keeps only its share of the optimizer state
        assert state < 0.75 * ref_state
    # between them the ranks hold every weight and gradient
    assert set().union(*(out[case][1] for out in two_ranks)) == ref_params.keys()
    assert set().union(*(out[case][3][0] for out in two_ranks)) == ref_grads[0].keys()
    if case.startswith("zero"):  # split between the ranks: all of it between the two
        assert sum(out[case][2] for out in two_ranks) == ref_state


def test_the_memory_ladder_per_rank_is_planned_within_15_percent(two_ranks):
    planned = {name: estimate(tiny(batch_size=BATCH, toggles=toggles), device="cpu", world_size=2).peak_bytes
               for name, toggles in LADDER.items()}
    measured = {name: max(out["peaks"][name] for out in two_ranks) for name in LADDER}
    for name in LADDER:
        error = (planned[name] - measured[name]) / measured[name]
        assert abs(error) < 0.15, f"{name}: planned {planned[name]:,} vs measured {measured[name]:,}: {error:+.1%}"
    # the ladder: DDP holds everything, ZeRO-1 splits the state, ZeRO-2 the gradients too, ZeRO-3 the weights too
    assert planned["ddp"] > planned["zero1"] > planned["zero2"] > planned["fsdp (zero3)"]
    # measured too, down to ZeRO-2 (on the tiny model ZeRO-3's per-block gathers cost about what it saves)
    assert measured["ddp"] > measured["zero1"] > measured["zero2"]


def test_ranks_that_split_the_model_count_each_token_once(two_ranks):
    single = scalekit.run(ladder_run())
    runs = two_ranks[0]["runs"]
    assert single.tokens_per_step == BATCH * single.config["seq_len"]
    for name, run in runs.items():
        # a tensor-parallel pair and a pipeline's 2 stages share the batch; the data-parallel modes split it
        shared = 2 if name.startswith(("tensor", "pipeline")) else 1
        assert [r["tokens_per_step"] for r in run.per_rank] == [single.tokens_per_step * shared // 2] * 2, name
        assert run.tokens_per_step == single.tokens_per_step, name  # DDP: the global batch; TP and PP: not doubled
        assert run.steps[-1].tokens == single.tokens_per_step, name  # each step's, as a launched run's plots show
        assert run.flops_per_step == pytest.approx(single.flops_per_step), name
        # tokens/s: each group of ranks sharing rows counted once (the mean of its ranks), summed over the groups
        assert run.tokens_per_s == pytest.approx(sum(r["tokens_per_s"] for r in run.per_rank) / shared), name
        # MFU: the model's FLOPs for those tokens over both ranks' peaks, the mean of the ranks' own
        assert run.mfu == pytest.approx(run.flops_per_step / run.tokens_per_step * run.tokens_per_s / 2e12), name
        assert run.mfu == pytest.approx(sum(r["mfu"] for r in run.per_rank) / 2), name
        assert f"tokens counted once per data-parallel group of {shared} rank(s)" in run.notes[-1], name
        assert f"summed over {2 // shared} group(s)" in run.notes[-1], name


def _fails_under_tensor_parallel(how: str):
    dist.init_process_group("gloo")
    with contextlib.ExitStack() as stack:
        ctx = build(tiny(batch_size=BATCH, toggles={"tensor_parallel": 2}).resolve(CPU), CPU, stack)
        train_step(ctx, next(ctx.batches))
        if dist.get_rank() == 1:
            if how == "hang":
                time.sleep(600)
            raise ValueError("rank one broke under tensor parallelism")
        train_step(ctx, next(ctx.batches))  # rank 0 waits in a block's all-reduce for rank 1


def test_a_rank_that_raises_under_tensor_parallel_is_named_first():
    with pytest.raises(LaunchError) as info:
        launch(_fails_under_tensor_parallel, "raise", nprocs=2, timeout_s=60)
    assert info.value.rank == 1
    assert str(info.value).splitlines()[0] == "rank 1 failed: ValueError: rank one broke under tensor parallelism"


@pytest.mark.slow  # the fault is the hang: the limit leaves the ranks time to build and take a step first
def test_a_rank_that_hangs_under_tensor_parallel_is_stopped_at_the_time_limit_and_named():
    with pytest.raises(LaunchError) as info:
        launch(_fails_under_tensor_parallel, "hang", nprocs=2, timeout_s=6)
    text = str(info.value)
    assert info.value.timed_out and text.startswith("the launch reached its time limit of 6 s"), text
    assert "rank 1 was in _fails_under_tensor_parallel (" in text  # where it hung, from its own stack


def test_a_degree_that_does_not_divide_the_heads_or_a_model_without_a_plan_is_refused_naming_the_numbers():
    from scalekit.models import GPT
    from scalekit.models.gpt import GPTConfig
    from scalekit.models.tensor_parallel import tp_plan

    gpt = GPT(GPTConfig(block_size=8, vocab_size=16, n_layer=1, n_head=6, n_embd=24))
    assert len(tp_plan(gpt, 2)[0]) == 1 and tp_plan(gpt, 2)[1] == 6
    with pytest.raises(ConfigError, match=r"tensor_parallel=4: the model's 6 attention heads do not split over 4 "
                                          r"ranks \(the degree must divide 6\)"):
        tp_plan(gpt, 4)
    with pytest.raises(ConfigError, match="tensor_parallel: Regressor has no tensor-parallel plan"):
        tp_plan(Regressor(), 2)
    with pytest.raises(ConfigError, match=r"tensor_parallel degree 4 does not divide 2 ranks: the ranks form one "
                                          r"\(pipeline, data parallel, tensor parallel\) mesh of shape \(1, 2/4, 4\)"):
        mesh_shape({"tp": 4}, 2)
    with pytest.raises(ConfigError, match="tensor_parallel degree 4 does not divide 6 ranks"):
        estimate(tiny(batch_size=BATCH, toggles={"tensor_parallel": 4}), device="cpu", world_size=6)


def test_sequence_parallel_is_spelled_as_an_option_of_the_degree_and_a_sequence_it_cannot_split_is_refused():
    from scalekit.toggles import normalise

    assert normalise({"tensor_parallel": "4, sequence_parallel"}) == {"tensor_parallel": "4,sequence_parallel"}
    assert parse("4,sequence_parallel") == (4, True) and parse(2) == (2, False)
    with pytest.raises(ConfigError, match=r"toggles\['tensor_parallel'\] must be True \(= 2\), a positive whole "
                                          r"number of ranks per block, or 'N,sequence_parallel'"):
        normalise({"tensor_parallel": "2,sequence"})
    cfg = tiny(batch_size=BATCH, seq_len=15, toggles={"tensor_parallel": "2,sequence_parallel"})
    with pytest.raises(LaunchError, match=r"tensor_parallel=2,sequence_parallel: the sequence of 15 tokens does not "
                                          r"split over 2 ranks \(the degree must divide RunConfig.seq_len=15\)"):
        launch(_builds, cfg, nprocs=2, timeout_s=60)


def _builds(cfg):
    dist.init_process_group("gloo")
    with contextlib.ExitStack() as stack:
        build(cfg.resolve(CPU), CPU, stack)


def test_the_planner_splits_the_blocks_and_keeps_the_batch_whole_in_a_tensor_parallel_group():
    one = estimate(tiny(preset="small", batch_size=BATCH), device="cpu")
    tp = estimate(tiny(preset="small", batch_size=BATCH, toggles={"tensor_parallel": 2}), device="cpu", world_size=2)
    ddp = estimate(tiny(preset="small", batch_size=BATCH, toggles=["ddp"]), device="cpu", world_size=2)
    assert one.params_bytes / 2 < tp.params_bytes < one.params_bytes  # blocks split, embeddings whole
    assert tp.activations_bytes > ddp.activations_bytes  # the whole batch, against half of it
    assert any("tensor_parallel: 1/2" in n for n in tp.notes)
    two_d = estimate(tiny(preset="small", batch_size=BATCH, toggles={"fsdp": True, "tensor_parallel": 2}),
                     device="cpu", world_size=4)  # fsdp shards what tensor_parallel left, over the 2 data ranks
    assert two_d.params_bytes == -(-tp.params_bytes // 2) and two_d.optimizer_state_bytes < tp.optimizer_state_bytes


def test_a_stage_count_that_does_not_divide_the_blocks_or_a_model_that_is_no_gpt_is_refused():
    from scalekit.models import GPT
    from scalekit.models.gpt import GPTConfig
    from scalekit.models.pipeline import bubble, split_stages
    from scalekit.toggles import normalise

    gpt = GPT(GPTConfig(block_size=8, vocab_size=16, n_layer=3, n_head=2, n_embd=8))
    assert [len(s.h) for s in split_stages(gpt, 2, 3)] == [1]
    with pytest.raises(ConfigError, match=r"GPT's 3 blocks do not split into 2 equal stages \(1 per rank on 2 "
                                          r"ranks\): the stages must divide 3"):
        split_stages(gpt, 0, 2)
    with pytest.raises(ConfigError, match=r"3 blocks do not split into 4 equal stages \(2 per rank on 2 ranks\)"):
        split_stages(gpt, 0, 2, per_rank=2)
    with pytest.raises(ConfigError, match="pipeline_parallel: Regressor is not split into stages here; scalekit "
                                          "splits the built-in GPT's blocks and the layers of Hugging Face decoders"):
        split_stages(Regressor(), 0, 2)
    with pytest.raises(ConfigError, match=r"'gpipe', '1f1b' or 'interleaved', optionally with '/micro-batches'"):
        normalise({"pipeline_parallel": "1f1b/0"})
    assert normalise({"pipeline_parallel": "gpipe/8"}) == {"pipeline_parallel": "gpipe/8"}
    assert bubble(2, 4) == pytest.approx(1 / 5) and bubble(4, 4) == pytest.approx(3 / 7)


def _two_d():
    dist.init_process_group("gloo")
    out = {model: train(config(model, {"fsdp": True, "tensor_parallel": 2})) for model in ("gpt", "Llama")}
    run = scalekit.run(ladder_run({"fsdp": True, "tensor_parallel": 2}))  # 2 tensor-parallel pairs split the batch
    out["counted"] = run.tokens_per_step, run.notes[-1]
    dist.destroy_process_group()
    return out


@pytest.mark.slow
def test_a_2d_mesh_of_4_ranks_fsdp_over_2_tensor_parallel_pairs_trains_like_one_process(one_process):
    outs = launch(_two_d, nprocs=4, timeout_s=240)
    for model in ("gpt", "Llama"):  # the built-in GPT, and a Llama split by its own tp_plan
        ref_losses, ref_params, _, ref_grads = one_process[model.lower()]
        for out in outs:
            losses, params, _, grads = out[model]
            assert losses == pytest.approx(ref_losses, rel=1e-5), model
            for name in ref_grads[0]:
                assert close(grads[0][name], ref_grads[0][name]) < 1e-5, (model, name)
            for name in ref_params:
                torch.testing.assert_close(params[name], ref_params[name], atol=5e-5, rtol=1e-4,
                                           msg=lambda m, name=name, model=model: f"{model} {name}: {m}")
    for out in outs:  # every token once: the batch's, not 4 ranks' worth
        tokens, note = out["counted"]
        assert tokens == BATCH * ladder_run().resolve(CPU).seq_len
        assert "batch_size/2 per rank: tokens counted once per data-parallel group of 2 rank(s)" in note
    with pytest.raises(ConfigError, match=r"tensor_parallel degree 4 does not divide 6 ranks: .* mesh of shape "
                                          r"\(1, 6/4, 4\)"):
        mesh_shape({"tp": 4}, 6)
