"""qat: torchao's fake quantization in training is the quantization it converts to; the run trains on every kind
of model with block linears; the plan traces it; QAT against PTQ reads held-out quality."""

from __future__ import annotations

import copy

import pytest
import torch

from scalekit import RunConfig, ToggleUnavailable, estimate, run
from scalekit.models import GPT, PRESETS
from scalekit.models import qat as qat_mod
from tests.helpers import ConvNet, built, classify_loss, image_batch, learns, tiny

pytest.importorskip("torchao")
pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.mark.parametrize("mode", list(qat_mod.MODES))
def test_fake_quantized_forward_is_the_converted_models_and_ptq_without_training(mode):
    torch.manual_seed(0)
    model = GPT(PRESETS["tiny"].gpt_config()).eval()
    x = torch.randint(0, 65, (2, 32))
    ptq = copy.deepcopy(model)
    assert qat_mod.quantize(ptq, mode) == qat_mod.prepare(model, mode) > 0
    with torch.no_grad():
        fake = model(x)[0]
        qat_mod.convert(model, mode)
        real, post = model(x)[0], ptq(x)[0]
    torch.testing.assert_close(real, post, rtol=0, atol=0)  # no training step: QAT's conversion is PTQ
    torch.testing.assert_close(fake, real, rtol=1e-3, atol=1e-3)  # training saw the rounding it converts to
    assert not qat_mod.fake_quantized_names(model)  # every fake-quantized linear was converted


def test_qat_trains_the_built_in_gpt_and_the_plan_traces_it():
    result = run(tiny(toggles={"qat": True}, steps=12, log_every=4))
    assert result.status == "ok", result.error
    assert learns(result), result.losses
    cfg = RunConfig(preset="tiny", device="cpu", steps=1, warmup_steps=0, toggles={"qat": True})
    planned, measured = estimate(cfg), run(cfg)
    assert abs(planned.peak_bytes - measured.peak_mem_bytes) < 0.15 * measured.peak_mem_bytes
    with built(tiny(toggles={"qat": True})) as ctx:
        assert len(qat_mod.fake_quantized_names(ctx.base_model)) == 4 * PRESETS["tiny"].gpt_config().n_layer


def test_qat_trains_a_hugging_face_llama():
    pytest.importorskip("transformers")
    from scalekit.hf import causal_lm

    result = run(RunConfig(model=causal_lm("llama", preset="tiny"), seq_len=16, batch_size=4, device="cpu", steps=8,
                           warmup_steps=1, log_every=2, toggles={"qat": True}))
    assert result.status == "ok", result.error
    assert learns(result, drop=0.2), result.losses


def test_a_model_without_block_linears_is_refused_naming_it():
    with pytest.raises(ToggleUnavailable, match="qat' found no linear layer.*ConvNet"):
        run(RunConfig(model=ConvNet, batch_fn=image_batch, loss_fn=classify_loss, device="cpu", steps=1,
                      warmup_steps=0, toggles={"qat": True}))


@pytest.mark.slow
def test_qat_against_ptq_reads_held_out_quality():
    from scalekit.training.finetune import finetune_config
    from scalekit.training.qat_quality import qat_vs_ptq

    out = qat_vs_ptq(finetune_config(batch_size=4, seq_len=32), steps=2, windows=2)
    assert out["fp32"]["agreement"] == 1.0
    for name in ("ptq", "qat"):
        assert 0.5 < out[name]["agreement"] <= 1.0 and out[name]["loss"] == pytest.approx(out["fp32"]["loss"], rel=0.2)
