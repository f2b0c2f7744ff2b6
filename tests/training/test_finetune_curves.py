"""Each fine-tuning method at its own learning rate, and the held-out loss read during training: a curve starts
where a run's heldout_loss_before does (one definition of the held-out loss), and the ladder gives adapters
their rate."""

from __future__ import annotations

import importlib.util

import pytest

from scalekit import run
from scalekit.training.finetune import finetune_config, finetune_ladder, heldout_curve, method_lr
from tests.helpers import CPU

SMALL = dict(seq_len=32, batch_size=4, device="cpu", steps=2, warmup_steps=1, threads=1)
needs_peft = pytest.mark.skipif(importlib.util.find_spec("peft") is None, reason="LoRA needs peft installed")


def test_method_lr_gives_adapters_and_a_head_their_rate_and_the_rest_the_base_rate():
    assert method_lr({}, 3e-4, 3e-3) == 3e-4
    assert method_lr({"checkpointing": 1}, 3e-4, 3e-3) == 3e-4
    for toggles in ({"lora": 8}, {"dora": 4}, {"head_only": True}, {"lora": 8, "quantized_base": "nf4"}):
        assert method_lr(toggles, 3e-4, 3e-3) == 3e-3
    assert method_lr({"lora": 8}, 3e-4, None) == 3e-4  # no adapter rate: one rate for every method


def test_a_curve_starts_at_the_runs_before_and_has_a_point_every_n_steps():
    cfg = finetune_config(**SMALL)
    points = heldout_curve(cfg, every=1, hw=CPU)
    assert [s for s, _ in points] == [0, 1, 2]
    measured = run(cfg, hw=CPU)
    assert measured.status == "ok", measured.error
    assert points[0][1] == measured.heldout_loss_before  # the same windows, the same pretrained weights
    assert points[-1][1] != points[0][1]  # training moved the model


def test_a_curve_reads_the_last_step_even_off_the_grid():
    points = heldout_curve(finetune_config(**{**SMALL, "steps": 3}), every=2, hw=CPU)
    assert [s for s, _ in points] == [0, 2, 3]


@pytest.mark.parametrize("every", [0, -1, 1.5, True])
def test_bad_every_names_the_argument(every):
    with pytest.raises(ValueError, match="every"):
        heldout_curve(finetune_config(**SMALL), every=every, hw=CPU)


def test_data_without_a_heldout_part_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="held-out"):
        heldout_curve(finetune_config(**{**SMALL, "data": "shakespeare"}), every=1, hw=CPU)


@needs_peft
def test_the_ladder_trains_adapters_at_adapter_lr_and_the_full_model_at_its_lr():
    rungs = [("full", {}), ("LoRA", {"lora": 2})]
    full, lora = finetune_ladder(finetune_config(**{**SMALL, "steps": 1}), rungs=rungs, adapter_lr=5e-3)
    assert full.status == lora.status == "ok", (full.error, lora.error)
    assert full.config["lr"] == finetune_config().lr and lora.config["lr"] == 5e-3
    # the curve of a LoRA run starts where the pretrained model is: B starts at zero
    assert heldout_curve(finetune_config(**SMALL, toggles={"lora": 2}), every=2, hw=CPU)[0][1] == \
        full.heldout_loss_before


def test_the_curves_figure_draws_a_line_per_method_and_the_before():
    pytest.importorskip("plotly", reason="figures need plotly")
    from scalekit.course.figures import heldout_curves_figure

    curves = {"full": [(0, 1.8), (5, 1.7)], "LoRA": [(0, 1.8), (5, 1.75)]}
    fig = heldout_curves_figure(curves, before=1.8)
    assert [t.name for t in fig.data] == ["full", "LoRA"]
    assert list(fig.data[1].x) == [0, 5] and list(fig.data[1].y) == [1.8, 1.75]
    assert any(shape.y0 == 1.8 for shape in fig.layout.shapes)  # the before line
