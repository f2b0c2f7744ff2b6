"""Corners of quantization on the families: the int8 KV cache refused up front where transformers' QuantizedCache
cannot go (sliding-window layers; keys per position not a whole number of hqq's groups), subclasses of nn.Linear
(Falcon's FalconLinear) quantized like nn.Linear and still computing what they computed, and a quantize or qat
that would change nothing refused in one line naming the model."""

from __future__ import annotations

import contextlib
import copy
import dataclasses

import pytest
import torch

from scalekit import ConfigError, GenerateConfig, RunConfig, ToggleUnavailable, generate, run
from tests.families import PlainLM, hf_config, hf_model
from tests.helpers import CPU, ConvNet, classify_loss, image_batch, one_thread

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore")  # libraries' own warnings (torchao, bitsandbytes' casts)

QUICK = dict(max_new_tokens=3, warmup_tokens=0, measure_memory=False, quality=False, device="cpu")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


@contextlib.contextmanager
def inductor_config_kept():
    """torchao's quantize_ sets inductor flags process-wide: put back afterwards, as the quantize toggle does."""
    from scalekit.toggles.quantize import keep_inductor_config

    with contextlib.ExitStack() as stack:
        keep_inductor_config(stack)
        yield


def causal_lm(model):
    from scalekit.hf import causal_lm

    return causal_lm(model)


def one_line(text: str) -> bool:
    return bool(text) and "\n" not in text.strip() and "Traceback" not in text


def refused(make, *names: str) -> str:
    """The one-line refusal `make()` raises, checked to name each of `names`."""
    with pytest.raises(ConfigError) as caught:
        make()
    message = str(caught.value)
    assert one_line(message), message
    for name in names:
        assert name in message, (name, message)
    return message


def int8_cache(model, prompt=(1, 2, 3)):
    return GenerateConfig(model=causal_lm(model), prompts=[list(prompt)], toggles={"kv_cache": "dynamic-int8"},
                          **QUICK)


# -- the int8 KV cache -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("family", "cls"), [("gemma2", "Gemma2ForCausalLM"), ("mistral", "MistralForCausalLM")])
def test_the_int8_cache_is_refused_on_sliding_window_layers_naming_them(family, cls):
    pytest.importorskip("hqq")
    refused(lambda: int8_cache(hf_model(family)), cls, "sliding_attention", "kv_cache")


def test_a_sliding_window_read_from_a_config_without_layer_types_or_switched_off():
    from scalekit.hf.generation import attention_layer_types

    on = transformers.Qwen2Config(num_hidden_layers=4, use_sliding_window=True, sliding_window=16, max_window_layers=2)
    off = transformers.Qwen2Config(num_hidden_layers=2, use_sliding_window=False, sliding_window=16)
    assert attention_layer_types(on) == ["full_attention"] * 2 + ["sliding_attention"] * 2
    assert attention_layer_types(off) == ["full_attention"] * 2
    mistral = hf_config("mistral")  # no layer_types: the window says every layer slides
    assert getattr(mistral, "layer_types", None) is None
    assert attention_layer_types(mistral) == ["sliding_attention"] * mistral.num_hidden_layers


def one_kv_head_llama():
    config = hf_config("llama")
    config.num_key_value_heads = 1
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")


@pytest.mark.parametrize("make", [lambda: hf_model("falcon"), one_kv_head_llama, lambda: hf_model("llama")],
                         ids=["Falcon: 1 kv head × 16", "Llama: 1 kv head × 16", "Llama: 2 kv heads × 16"])
def test_the_int8_cache_groups_divide_each_positions_keys_so_any_prompt_length_fits(make):
    """hqq quantizes a (batch, kv heads, positions, head dim) tensor in groups: with 64 values a group, a model with
    16 or 32 values per position fails on prompts of some lengths.  The group is the largest divisor of 64 that
    divides a position's keys, and every prompt length generates the tokens the unquantized cache does."""
    pytest.importorskip("hqq")
    from scalekit.hf.generation import kv_group_values

    model = make()
    per_position = (getattr(model.config, "num_key_value_heads", None) or 1) * 16  # head dim 16 in tests/families
    assert kv_group_values(model.config) == per_position  # 16 or 32: a divisor of 64
    for length in (3, 5):
        prompt = tuple(range(1, length + 1))
        quantized = generate(int8_cache(model, prompt), hw=CPU)
        plain = generate(dataclasses.replace(int8_cache(model, prompt), toggles={"kv_cache": "dynamic"}), hw=CPU)
        assert quantized.status == "ok", quantized.error
        assert quantized.token_ids == plain.token_ids and len(quantized.token_ids[0]) == 3  # 8-bit keys keep these tiny models' greedy tokens


def test_a_64_value_group_on_16_values_a_position_is_the_failure_the_smaller_group_avoids():
    pytest.importorskip("hqq")
    transformers_cache = transformers.QuantizedCache(backend="hqq", config=one_kv_head_llama().config, nbits=8,
                                                     q_group_size=64)
    keys = torch.randn(1, 1, 3, 16)  # one row, one kv head, 3 positions, head dim 16: 48 values
    with pytest.raises(AssertionError, match="group_size"):  # hqq's own check
        transformers_cache.update(keys, keys.clone(), 0)


def test_a_head_shape_too_small_for_groups_of_8_is_refused_naming_it():
    pytest.importorskip("hqq")
    config = hf_config("llama")
    config.num_key_value_heads, config.head_dim = 1, 4  # 4 values a position: a group's scale outweighs its codes
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    refused(lambda: int8_cache(model), "LlamaForCausalLM", "1 kv head(s) × head dim 4", "kv_cache='dynamic'")


# -- subclasses of nn.Linear -------------------------------------------------------------------------------------
class BiasApartLinear(torch.nn.Linear):
    """A subclass computing x·Wᵀ, then + b, as FalconLinear does."""

    def forward(self, x):
        y = x @ self.weight.T
        return y if self.bias is None else y + self.bias


class ScaledLinear(torch.nn.Linear):
    """A subclass that is not the linear map of its weights: a quantizer must leave it alone."""

    def forward(self, x):
        return 2.0 * super().forward(x)


class SubclassLM(PlainLM):
    """A language model of a user's own whose blocks' linears are subclasses of nn.Linear (the head a plain one)."""

    def __init__(self, layer: type = BiasApartLinear):
        super().__init__(d=64, hidden=128, linear=layer)


def logits(model, x):
    with torch.no_grad():
        out = model(x)
    return out.logits if hasattr(out, "logits") else out


def quantized_error(model, method: str) -> tuple[int, float]:
    """(layers quantized, largest logit error relative to the largest logit) of `method` on a copy of `model`."""
    from scalekit.models.quantization import quantize_model

    model = model.eval()
    x = torch.randint(0, 65, (2, 16), generator=torch.Generator().manual_seed(0))
    quantized = copy.deepcopy(model)
    with inductor_config_kept():
        n = quantize_model(quantized, method, torch.float32, "cpu")
    ref = logits(model, x)
    return n, float((logits(quantized, x) - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("method", ["hqq-8bit", "torchao-int8", "torch-dynamic-int8"])
def test_falcon_linears_are_quantized_and_its_logits_stay_as_close_as_llamas(method):
    from scalekit.models.quantization import method_available

    ok, why = method_available(method, "cpu")
    if not ok:
        pytest.skip(why)
    falcon, llama = hf_model("falcon"), hf_model("llama")
    assert {type(m).__name__ for m in falcon.modules()} >= {"FalconLinear"}
    (n_falcon, err_falcon), (n_llama, err_llama) = quantized_error(falcon, method), quantized_error(llama, method)
    assert n_falcon == 4 * falcon.config.num_hidden_layers  # query_key_value, dense, dense_h_to_4h, dense_4h_to_h
    assert n_llama == 7 * llama.config.num_hidden_layers
    # int8: about 0.6% (hqq, torchao) and 2.5% (torch's one scale per tensor) of the largest logit on both families
    assert err_falcon < 0.05 and err_falcon < 2 * err_llama + 0.01, (err_falcon, err_llama)


def test_a_subclass_computing_the_same_is_quantized_and_one_computing_otherwise_is_left_alone():
    pytest.importorskip("hqq")
    from scalekit.models.quantization import is_linear_layer, target_linears

    torch.manual_seed(0)
    same = SubclassLM(BiasApartLinear)
    n, err = quantized_error(same, "hqq-8bit")
    assert n == 4 and err < 0.02, (n, err)
    other = SubclassLM(ScaledLinear)
    assert not is_linear_layer(other.blocks[0][0]) and is_linear_layer(same.blocks[0][0])
    assert target_linears(other) == []  # the head is outside the blocks, as in every model with blocks


def test_falcon_trains_with_qat_on_all_its_linears():
    pytest.importorskip("torchao")
    from scalekit.hf import causal_lm as spec

    result = run(RunConfig(model=spec(hf_model("falcon")), seq_len=8, batch_size=2, device="cpu", steps=1,
                           warmup_steps=0, log_every=1, toggles={"qat": "int4-weight"}), hw=CPU)
    assert result.status == "ok", result.error
    assert any("qat=int4-weight: 8 linear layers" in n for n in result.notes), result.notes


def test_what_the_exact_type_test_kept_out_stays_out():
    from scalekit.models.quantization import quantize_model, target_linears

    # nn.MultiheadAttention reads its out_proj's weight itself: the encoder layer's two MLP linears only
    encoder = torch.nn.Sequential(*[torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
                                    for _ in range(2)])
    names = {id(m): n for n, m in encoder.named_modules()}
    assert sorted(names[id(lin)] for *_, lin in target_linears(encoder)) == \
        ["0.linear1", "0.linear2", "1.linear1", "1.linear2"]
    pytest.importorskip("torchao")
    model = SubclassLM(torch.nn.Linear)
    with inductor_config_kept():
        assert quantize_model(model, "torchao-int8", torch.float32, "cpu") == 4
        # layers already quantized are not linear layers any more: a second quantize would change nothing
        refused(lambda: quantize_model(model, "torchao-int8", torch.float32, "cpu"), "SubclassLM", "found no linear")
    from scalekit.models import qat

    fake = SubclassLM(torch.nn.Linear)
    assert qat.prepare(fake, "int4-weight") == 4
    assert target_linears(fake) == []  # torchao's FakeQuantizedLinear wraps its quantizers


# -- toggles that would change nothing ---------------------------------------------------------------------------
class Bigram(torch.nn.Module):
    """A language model with no linear layer: the next token's logits are a row of a table."""

    def __init__(self, vocab: int = 65):
        super().__init__()
        self.table = torch.nn.Embedding(vocab, vocab)

    def forward(self, idx):
        return self.table(idx)


@pytest.mark.parametrize("method", ["hqq-8bit", "torch-dynamic-int8"])
def test_quantize_on_a_model_without_linear_layers_is_refused_before_the_run(method):
    refused(lambda: GenerateConfig(model=Bigram(), prompts=[[1, 2]], toggles={"quantize": method}, **QUICK),
            "quantize", "Bigram", "found no linear layer")
    refused(lambda: GenerateConfig(model=ConvNet, prompts=[[1, 2]], toggles={"quantize": method}, **QUICK),
            "quantize", "ConvNet", "found no linear layer")
    from scalekit.models.quantization import quantize_model  # and at the build, for a model only seen there

    refused(lambda: quantize_model(Bigram(), method, torch.float32, "cpu"), f"'quantize'={method!r}", "Bigram")


def test_qat_on_a_model_without_linear_layers_is_refused_before_the_run():
    refused(lambda: RunConfig(model=Bigram, batch_fn=lambda b, d: torch.randint(0, 65, (b, 8), device=d),
                              loss_fn=lambda m, x: m(x).mean(), device="cpu", toggles={"qat": True}),
            "qat", "Bigram", "found no linear layer")
    refused(lambda: RunConfig(model=ConvNet, batch_fn=image_batch, loss_fn=classify_loss, device="cpu",
                              toggles={"qat": True}), "qat", "ConvNet", "found no linear layer")


def test_a_model_with_linear_layers_is_not_refused():
    from scalekit.hf.family_of import toggle_family
    from scalekit.toggles import TOGGLES

    for source in (SubclassLM, SubclassLM(), "tiny"):
        family = toggle_family(source) if source != "tiny" else GenerateConfig(**QUICK).family()
        assert TOGGLES["quantize"].applies_to(family) == (True, "")
        assert TOGGLES["qat"].applies_to(family) == (True, "")
    assert isinstance(ToggleUnavailable("x"), ConfigError)
