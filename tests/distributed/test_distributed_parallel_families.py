"""Tensor and pipeline parallelism across Hugging Face families: what is split trains like one process, what is
not is refused in one line naming the model and what stops it.

One launch of 2 gloo ranks trains each split family (Phi-3's fused qkv and gate/up, Gemma 2's alternating sliding
and full layers, capped logits and tied embedding, GPT-NeoX's parallel residual) against one process with the
whole batch; the stages chained in one process give each family's own logits.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist

import scalekit
from scalekit.errors import ConfigError, ToggleUnavailable
from scalekit.launch import launch
from tests.distributed.test_distributed_parallel import BATCH, close, train
from tests.families import hf_config, hf_model
from tests.forking import no_process_left_behind  # noqa: F401 - the same deadline and cleanup here

SPLIT = {  # name: (family, toggles)
    "pipeline_parallel, Phi-3": ("phi3", {"pipeline_parallel": "gpipe"}),
    "pipeline_parallel, Gemma 2": ("gemma2", {"pipeline_parallel": "1f1b/2"}),
    "pipeline_parallel, GPT-NeoX": ("gpt_neox", {"pipeline_parallel": "gpipe"}),
    "tensor_parallel, Phi-3": ("phi3", {"tensor_parallel": 2}),
    "tensor_parallel, GPT-NeoX": ("gpt_neox", {"tensor_parallel": 2}),
    "tensor_parallel, Gemma 2": ("gemma2", {"tensor_parallel": 2}),
}
NOT_SPLIT = ("gpt2", "opt", "falcon")  # transformers 5.25 declares neither plan for them
SEQ_LEN = 24  # longer than Gemma 2's window of 16: its sliding layers' masks differ from its full layers'


def config(family: str, toggles: dict | None = None) -> scalekit.RunConfig:
    from scalekit.hf import causal_lm  # in the test: transformers stays out of collection

    return scalekit.RunConfig(model=causal_lm(hf_config(family)), batch_size=BATCH, seq_len=SEQ_LEN,
                              data="synthetic", steps=3, warmup_steps=0, device="cpu", toggles=toggles or {})


def _every_family():
    dist.init_process_group("gloo")
    out = {name: train(config(family, toggles)) for name, (family, toggles) in SPLIT.items()}
    dist.destroy_process_group()
    return out


def test_each_family_split_by_a_pipeline_or_tensor_parallel_trains_like_one_process():
    ref = {family: train(config(family)) for family in {family for family, _ in SPLIT.values()}}  # (forked after)
    outs = launch(_every_family, nprocs=2, timeout_s=300)
    for name, (family, _) in SPLIT.items():
        ref_losses, ref_params, ref_state, ref_grads = ref[family]
        for out in outs:
            losses, params, state, grads = out[name]
            assert state < ref_state, (name, state, ref_state)  # each rank holds a part of the weights' Adam state
            assert losses == pytest.approx(ref_losses, rel=1e-5), name
            for step in range(len(ref_grads)):
                for key in grads[step]:
                    assert close(grads[step][key], ref_grads[step][key]) < 1e-4, (name, step, key)
            for key in params:
                torch.testing.assert_close(params[key], ref_params[key], atol=5e-5, rtol=1e-4,
                                           msg=lambda m, key=key, name=name: f"{name}, {key}: {m}")
        # between them the ranks hold every weight
        assert set().union(*(out[name][1] for out in outs)) == ref_params.keys(), name


@pytest.mark.parametrize("family", ["phi3", "gemma2", "gpt_neox", "llama"])
def test_the_stages_chained_in_one_process_give_the_models_own_logits(family):
    """Large logits (the head's weight scaled) so that Gemma 2's cap bites; a sequence longer than its window."""
    from scalekit.models.decoder_stages import decoder_targets
    from scalekit.models.pipeline import split_stages

    model = hf_model(family).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(40)
    ids = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(0))
    x, _ = decoder_targets({"input_ids": ids, "labels": ids})
    for stage in [s for rank in range(2) for s in split_stages(model, rank, 2)]:
        x = stage(x)
    own = model(input_ids=ids).logits
    assert own.abs().max() > 10  # (the cap, 30, changes logits this large)
    torch.testing.assert_close(x, own, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", NOT_SPLIT)
def test_a_family_without_plans_is_refused_by_both_naming_its_class_and_what_stops_it(family):
    from scalekit.models.pipeline import split_stages
    from scalekit.models.tensor_parallel import tp_plan

    model = hf_model(family)
    name = type(model).__name__
    with pytest.raises(ConfigError, match=rf"^pipeline_parallel: {name} \({family}\) is not split into stages here; "
                                          rf".*\(config.base_model_pp_plan; .*\), and transformers declares none"):
        split_stages(model, 0, 2)
    with pytest.raises(ConfigError, match=rf"^tensor_parallel: {name} has no tensor-parallel plan: .* transformers "
                                          rf"declares none for this model"):
        tp_plan(model, 2)
    for toggle in ({"pipeline_parallel": "gpipe"}, {"tensor_parallel": 2}):
        with pytest.raises(ToggleUnavailable, match=name):
            config(family, toggle)


class NanoBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = torch.nn.Module()
        self.attn.c_attn = torch.nn.Linear(8, 24)


class NanoGPT(torch.nn.Module):
    """A model of your own with the built-in GPT's attribute names (transformer.h[0].attn.c_attn), not its class."""

    def __init__(self):
        super().__init__()
        self.transformer = torch.nn.Module()
        self.transformer.h = torch.nn.ModuleList([NanoBlock()])


def test_only_the_built_in_gpt_gets_its_plan_gpt2_and_a_nanogpt_style_model_are_refused_naming_their_class():
    from scalekit.models.gpt import GPT, GPTConfig
    from scalekit.models.tensor_parallel import is_builtin_gpt, tp_plan

    gpt = GPT(GPTConfig(block_size=8, vocab_size=16, n_layer=2, n_head=4, n_embd=16))
    assert is_builtin_gpt(gpt) and len(tp_plan(gpt, 2)[0]) == 2
    gpt2 = hf_model("gpt2")  # its c_attn a Conv1D (weight in × out): the GPT's split would cut it wrongly
    for model in (gpt2, NanoGPT()):
        assert not is_builtin_gpt(model)
        with pytest.raises(ConfigError, match=rf"^tensor_parallel: {type(model).__name__} has no tensor-parallel "
                                              rf"plan: scalekit splits the built-in GPT \(scalekit.models.gpt.GPT\)"):
            tp_plan(model, 2)


def test_applicable_says_which_families_each_toggle_splits():
    from scalekit.hf import causal_lm

    for (family, splits), model in itertools.product(
            (("phi3", True), ("gpt_neox", True), ("gemma2", True), ("opt", False), ("falcon", False)),
            (causal_lm, lambda config: config)):  # causal_lm(config), or the transformers config itself
        table = scalekit.applicable(model(hf_config(family)))
        for toggle in ("pipeline_parallel", "tensor_parallel"):
            status, reason = table.status(toggle, "train")
            assert (status != "does not apply") == splits, (family, toggle, status, reason)
            if not splits:
                assert "base_model_" in reason and "ForCausalLM" in reason, reason


def test_sequence_parallel_norms_on_a_plan_that_gathers_or_a_model_without_base_model_norm_are_refused_before_a_split():
    from scalekit.models.tensor_parallel import parallelize

    with pytest.raises(ConfigError, match=r"^tensor_parallel=2,sequence_parallel: Phi3ForCausalLM's plan takes or "
                                          r"gives its split layers' activations whole \(colwise_gather_output, "
                                          r"rowwise_split_input\)"):
        parallelize(hf_model("phi3"), None, 2, sequence_parallel=True)  # (refused before the mesh is used)
    with pytest.raises(ConfigError, match=r"^tensor_parallel sequence_parallel: GPTNeoXForCausalLM has no "
                                          r"base_model.norm"):
        parallelize(hf_model("gpt_neox"), None, 2, sequence_parallel=True)


def test_a_decoder_whose_forward_does_what_the_stages_do_not_is_refused_naming_it_and_why():
    import transformers

    from scalekit.models.decoder_stages import config_refusal, decoder_refusal

    gemma3 = transformers.AutoModelForCausalLM.from_config(transformers.Gemma3TextConfig(
        vocab_size=65, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=128, sliding_window=16))
    assert decoder_refusal(gemma3) == ("pipeline_parallel: Gemma3ForCausalLM's rotary embedding differs by layer "
                                       "kind (its forward takes a layer_type), which the stages do not compute")
    cohere = transformers.CohereConfig(vocab_size=65, hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
    assert config_refusal(cohere, "CohereForCausalLM") == (
        "pipeline_parallel: CohereForCausalLM (cohere) scales its embeddings or logits in its forward (logit_scale), "
        "which its stages do not do")
