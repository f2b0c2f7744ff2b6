"""pipeline_parallel on a Hugging Face decoder (a tiny Llama built from its config) trains like one process.

2 gloo ranks, each holding its stages (the embeddings on the first, the norm and head on the last), against one
process with the whole batch: losses, every step's gradients and the weights after a few steps, for every
schedule, and a Qwen2 whose embedding and head share one weight (the tie kept across the two end stages).
"""

from __future__ import annotations

import contextlib
import time

import pytest
import torch
import torch.distributed as dist

import scalekit
from scalekit.errors import ConfigError, ToggleUnavailable
from scalekit.launch import LaunchError, launch
from scalekit.training.build import build, train_step
from tests.distributed.test_distributed_parallel import (
    BATCH,
    CPU,
    close,
    one_step_peak,
    train,
    train_and_peak,
)
from tests.forking import no_process_left_behind  # noqa: F401 - the same deadline and cleanup here

SHAPE = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=16)
CASES = {  # name: (family, pipeline_parallel)
    "gpipe": ("llama", "gpipe"),
    "1f1b, 2 micro-batches": ("llama", "1f1b/2"),
    "interleaved (4 stages on 2 ranks)": ("llama", "interleaved"),
    "1f1b, Qwen2 with tied embedding and head": ("qwen2", "1f1b"),
}

INTERLEAVED = "interleaved (4 stages on 2 ranks)"


def model_config(family: str, **changes):
    import transformers

    if family == "qwen2":
        return transformers.Qwen2Config(**{**SHAPE, "tie_word_embeddings": True, **changes})
    return getattr(transformers, f"{family.capitalize()}Config")(**{**SHAPE, **changes})


def config(family: str, toggles: dict | None = None, **changes) -> scalekit.RunConfig:
    from scalekit.hf import causal_lm  # in the test: transformers stays out of collection

    return scalekit.RunConfig(model=causal_lm(model_config(family, **changes)), batch_size=BATCH, seq_len=16,
                              data="synthetic", steps=3, warmup_steps=0, device="cpu", toggles=toggles or {})


def _all_schedules():
    dist.init_process_group("gloo")
    out = {name: train(config(family, {"pipeline_parallel": value})) for name, (family, value) in CASES.items()
           if name not in ("gpipe", INTERLEAVED)}
    # GPipe and the interleaved schedule trained, then each rank's measured peak of one more step (the engine's
    # per-rank accounting), for the planner
    out["gpipe"], out["peak"] = train_and_peak(config("llama", {"pipeline_parallel": "gpipe"}))
    family, value = CASES[INTERLEAVED]
    out[INTERLEAVED], out["interleaved peak"] = train_and_peak(config(family, {"pipeline_parallel": value}))
    dist.destroy_process_group()
    return out


@pytest.fixture(scope="module")
def two_ranks():
    return launch(_all_schedules, nprocs=2, timeout_s=240)


@pytest.fixture(scope="module")
def one_process():  # first: transformers, imported here, is then inherited by the forked ranks
    return {family: train(config(family)) for family in ("llama", "qwen2")}


@pytest.mark.parametrize("case", CASES)
def test_every_schedule_trains_a_hugging_face_llama_like_one_process(case, one_process, two_ranks):
    ref_losses, ref_params, _, ref_grads = one_process[CASES[case][0]]
    for out in two_ranks:
        losses, params, _, grads = out[case]
        assert losses == pytest.approx(ref_losses, rel=1e-5)
        for step in range(len(ref_grads)):  # every step's gradients, where this rank holds the weight
            for name in grads[step]:
                assert close(grads[step][name], ref_grads[step][name]) < (1e-5 if step == 0 else 1e-4), (step, name)
        for name in params:
            torch.testing.assert_close(params[name], ref_params[name], atol=5e-5, rtol=1e-4,
                                       msg=lambda m, name=name: f"{name}: {m}")
        assert len(params) < len(ref_params)  # a rank holds only its stages' weights
    # between them the ranks hold every weight and gradient
    assert set().union(*(out[case][1] for out in two_ranks)) == ref_params.keys()
    assert set().union(*(out[case][3][0] for out in two_ranks)) == ref_grads[0].keys()


def test_the_planner_gives_each_stages_memory_within_15_percent_of_the_measured_peak(two_ranks):
    from scalekit.plan import estimate

    cfg = config("llama", {"pipeline_parallel": "gpipe"})
    planned = estimate(cfg, device="cpu", world_size=2)
    measured = max(out["peak"] for out in two_ranks)
    error = (planned.peak_bytes - measured) / measured
    assert abs(error) < 0.15, f"planned {planned.peak_bytes:,} vs measured {measured:,}: {error:+.1%}"
    each_stage_within_15_percent(planned, [out["peak"] for out in two_ranks])  # rank r: stage r
    whole = estimate(config("llama", ["ddp"]), device="cpu", world_size=2)  # every rank the whole model
    assert planned.params_bytes < whole.params_bytes and planned.activations_bytes < whole.activations_bytes


def test_the_planner_gives_each_rank_of_an_interleaved_pipeline_its_memory_within_15_percent(two_ranks):
    from scalekit.plan import estimate

    planned = estimate(config("llama", {"pipeline_parallel": "interleaved"}), device="cpu", world_size=2)
    assert len(planned.stage_peaks_bytes) == 2  # one figure per rank, each holding two of the four stages
    each_stage_within_15_percent(planned, [out["interleaved peak"] for out in two_ranks])


def each_stage_within_15_percent(planned, peaks: list[int]) -> None:
    """The plan of each pipeline stage against the measured peaks of its ranks (`peaks` by rank, a stage's ranks
    side by side: the pipeline is the mesh's first dimension), and the stage planned highest is the measured one."""
    per = len(peaks) // len(planned.stage_peaks_bytes)
    measured = [max(peaks[s * per:(s + 1) * per]) for s in range(len(planned.stage_peaks_bytes))]
    for stage, (plan, peak) in enumerate(zip(planned.stage_peaks_bytes, measured, strict=True)):
        error = (plan - peak) / peak
        assert abs(error) < 0.15, f"stage {stage}: planned {plan:,} vs measured {peak:,} ({peaks}): {error:+.1%}"
    assert planned.peak_bytes == max(planned.stage_peaks_bytes)
    assert measured.index(max(measured)) == planned.stage_peaks_bytes.index(planned.peak_bytes), (measured, planned)


def _pipelines_side_by_side():
    dist.init_process_group("gloo")
    two_d = {"pipeline_parallel": "1f1b/2,stages=2", "fsdp": True}
    out = {}
    for model, cfg in (("gpt", gpt_config(two_d)), ("llama", config("llama", two_d))):  # trained, then each rank's
        out[model], out[f"{model} 1f1b peak"] = train_and_peak(cfg)  # measured peak, for the planner
    gpipe = {"pipeline_parallel": "gpipe,stages=2", "fsdp": True}
    for model, cfg in (("gpt", gpt_config(gpipe)), ("llama", config("llama", gpipe))):
        out[f"{model} peak"] = one_step_peak(cfg)
    dist.destroy_process_group()
    return out


def gpt_config(toggles: dict | None = None):
    from tests.distributed.test_distributed_parallel import config as parallel_config

    return parallel_config("gpt", toggles)


def tied(ref: dict, name: str) -> torch.Tensor:
    """The reference's tensor of `name`; the GPT's head on the last stage is its embedding's copy (one name there)."""
    return ref[name] if name in ref else ref[{"lm_head.weight": "transformer.wte.weight"}[name]]


def test_two_pipelines_side_by_side_sharded_by_fsdp_train_like_one_process(one_process):
    """4 ranks as a (pipeline 2, data parallel 2) mesh: each pipeline its half of the batch, each stage sharded
    by fsdp over the two pipelines; the built-in GPT (tied embedding and head) and a Llama."""
    from scalekit.plan import estimate

    refs = {"gpt": train(gpt_config()), "llama": one_process["llama"]}
    outs = launch(_pipelines_side_by_side, nprocs=4, timeout_s=240)
    # the planner: each rank's peak, the last stage's (its logits and loss; fsdp's stage held gathered between the
    # micro-batches' backwards) the highest, within 15% of the measured
    gpipe = {"pipeline_parallel": "gpipe,stages=2", "fsdp": True}
    for model, cfg in (("gpt", gpt_config(gpipe)), ("llama", config("llama", gpipe))):
        planned = estimate(cfg, device="cpu", world_size=4)
        peaks = [out[f"{model} peak"] for out in outs]  # ranks 0, 1: the first stage; 2, 3: the last
        measured = max(peaks)
        error = (planned.peak_bytes - measured) / measured
        assert abs(error) < 0.15, f"{model}: planned {planned.peak_bytes:,} vs measured {measured:,} ({peaks}): " \
                                  f"{error:+.1%}"
        assert min(peaks[2:]) > max(peaks[:2]), (model, peaks)
        if model == "llama":  # (a traced plan is planned stage by stage)
            each_stage_within_15_percent(planned, peaks)
    # 1F1B, as trained: the first stage holds both micro-batches as its first backward begins, the last one (and
    # its head's); the Llama's plan follows each stage, within 15%, the first the highest
    two_d = {"pipeline_parallel": "1f1b/2,stages=2", "fsdp": True}
    one_f_one_b = estimate(config("llama", two_d), device="cpu", world_size=4)
    peaks = [out["llama 1f1b peak"] for out in outs]
    each_stage_within_15_percent(one_f_one_b, peaks)
    assert one_f_one_b.stage_peaks_bytes[0] > one_f_one_b.stage_peaks_bytes[1] and max(peaks[:2]) > max(peaks[2:])
    # the GPT's analytic plan is its fullest stage's: 2 micro-batches on 2 stages, the first holds both (GPipe's
    # count), and the plan stays at or above the peak
    gpt_peaks = [out["gpt 1f1b peak"] for out in outs]
    assert estimate(gpt_config(two_d), device="cpu", world_size=4).peak_bytes >= max(gpt_peaks), gpt_peaks
    for out in outs:
        for model, (ref_losses, ref_params, _, ref_grads) in refs.items():
            losses, params, _, grads = out[model]
            assert losses == pytest.approx(ref_losses, rel=1e-5)
            for step in range(len(ref_grads)):
                for name in grads[step]:
                    tol = 1e-5 if step == 0 else 1e-4
                    assert close(grads[step][name], tied(ref_grads[step], name)) < tol, (model, step, name)
            for name in params:
                torch.testing.assert_close(params[name], tied(ref_params, name), atol=5e-5, rtol=1e-4)


def test_a_pipeline_mesh_that_does_not_fit_the_ranks_is_refused_naming_the_numbers():
    from scalekit.distributed.sharding import mesh_shape
    from scalekit.plan import estimate
    from scalekit.toggles import normalise

    with pytest.raises(ConfigError, match=r"pipeline_parallel stages 3 does not divide 4 ranks: the ranks form one "
                                          r"\(pipeline, data parallel, tensor parallel\) mesh of shape \(3, 4/3, 1\), "
                                          r"so 3 must divide 4"):
        mesh_shape({"pp": 3}, 4)
    with pytest.raises(ConfigError, match="pipeline_parallel stages 3 does not divide 4 ranks: .* so 3 must divide 4"):
        estimate(gpt_config({"pipeline_parallel": "gpipe,stages=3", "fsdp": True}), device="cpu", world_size=4)
    assert normalise({"pipeline_parallel": "1f1b/8, stages=2"}) == {"pipeline_parallel": "1f1b/8,stages=2"}
    with pytest.raises(ConfigError, match=r"and ',stages=S' \(S stages over the ranks"):
        normalise({"pipeline_parallel": "1f1b,ranks=2"})
    two_d = estimate(gpt_config({"pipeline_parallel": "gpipe,stages=2", "fsdp": True}), device="cpu", world_size=4)
    pp = estimate(gpt_config({"pipeline_parallel": "gpipe"}), device="cpu", world_size=2)
    assert two_d.params_bytes == -(-pp.params_bytes // 2)  # fsdp halves what each stage holds


def _fails_under_the_pipeline(how: str):
    dist.init_process_group("gloo")
    with contextlib.ExitStack() as stack:
        ctx = build(config("llama", {"pipeline_parallel": "1f1b"}).resolve(CPU), CPU, stack)
        train_step(ctx, next(ctx.batches))
        if dist.get_rank() == 1:
            if how == "hang":
                time.sleep(600)
            raise ValueError("rank one broke inside the pipeline")
        train_step(ctx, next(ctx.batches))  # rank 0 waits for the activations' gradient from rank 1


def test_a_rank_that_raises_under_pipeline_parallel_on_a_hugging_face_model_is_named_first():
    with pytest.raises(LaunchError) as info:
        launch(_fails_under_the_pipeline, "raise", nprocs=2, timeout_s=60)
    assert info.value.rank == 1
    assert str(info.value).splitlines()[0] == "rank 1 failed: ValueError: rank one broke inside the pipeline"


@pytest.mark.slow  # the fault is the hang: the limit leaves the ranks time to build and take a step first
def test_a_rank_that_hangs_under_pipeline_parallel_on_a_hugging_face_model_is_stopped_at_the_time_limit_and_named():
    import transformers

    # a Llama built here first: the forked ranks inherit transformers' modules, imported, and spend the limit on
    # building and a step, then the hang
    transformers.AutoModelForCausalLM.from_config(model_config("llama"))
    started = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(_fails_under_the_pipeline, "hang", nprocs=2, timeout_s=6)
    text = str(info.value)
    assert info.value.timed_out and text.startswith("the launch reached its time limit of 6 s"), text
    assert "rank 1 was in _fails_under_the_pipeline (" in text  # where it hung, from its own stack
    assert time.monotonic() - started < 30  # stopped at the limit, not at gloo's own timeout (and no process left:
    # the fixture checks)


def test_layers_that_do_not_split_into_the_stages_or_a_family_not_split_are_refused_naming_the_numbers():
    import transformers

    from scalekit.hf import causal_lm
    from scalekit.models.pipeline import split_stages

    three = transformers.AutoModelForCausalLM.from_config(model_config("llama", num_hidden_layers=3))
    assert [len(s.layers) for s in split_stages(three, 1, 3)] == [1]
    with pytest.raises(ConfigError, match=r"LlamaForCausalLM's 3 blocks do not split into 2 equal stages \(1 per rank on 2 "
                                          r"ranks\): the stages must divide 3"):
        split_stages(three, 0, 2)
    with pytest.raises(ConfigError, match=r"3 blocks do not split into 4 equal stages \(2 per rank on 2 ranks\)"):
        split_stages(three, 0, 2, per_rank=2)
    gpt2 = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=16, bos_token_id=0,
                                   eos_token_id=0)
    with pytest.raises(ConfigError, match=r"GPT2LMHeadModel \(gpt2\) is not split into stages here; scalekit splits "
                                          r"the built-in GPT's blocks and the layers of Hugging Face decoders whose "
                                          r"config declares their order \(config.base_model_pp_plan; .*\), and "
                                          r"transformers declares none for this model"):
        split_stages(transformers.AutoModelForCausalLM.from_config(gpt2), 0, 2)
    with pytest.raises(ToggleUnavailable, match=r"toggle 'pipeline_parallel' does not apply: GPT2LMHeadModel \(gpt2\) is not split "
                                                r"into stages here; .* transformers declares none for this model"):
        scalekit.RunConfig(model=causal_lm(gpt2), toggles={"pipeline_parallel": "gpipe"})


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3"])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_the_stages_chained_in_one_process_give_the_models_own_loss(family, attention):
    """Each family split here: its stages, run one after another, are its forward (a Mistral with a sliding window
    shorter than the sequence, so the window's mask is exercised)."""
    import transformers

    from scalekit.models.decoder_stages import decoder_targets, summed_loss
    from scalekit.models.pipeline import split_stages

    changes = {"head_dim": 8} if family == "qwen3" else {"sliding_window": 5} if family == "mistral" else {}
    model = transformers.AutoModelForCausalLM.from_config(model_config(family, **changes),
                                                          attn_implementation=attention)
    ids = torch.randint(0, 64, (3, 16), generator=torch.Generator().manual_seed(0))
    x, targets = decoder_targets({"input_ids": ids, "labels": ids})
    for stage in [s for rank in range(2) for s in split_stages(model, rank, 2)]:
        x = stage(x)
    loss = summed_loss(x, targets) / (targets != -100).sum()
    assert loss.item() == pytest.approx(model(input_ids=ids, labels=ids).loss.item(), rel=1e-6)
