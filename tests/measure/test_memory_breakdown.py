"""Every run reports its peak split in four parts, and the stacked-bar figure shows them."""

from __future__ import annotations

import json

import pytest

from scalekit import estimate, run
from scalekit.course.figures import PARTS, memory_breakdown_figure
from scalekit.measure.memory import storage_bytes
from tests.helpers import built, tiny

ONE_STEP = dict(steps=1, warmup_steps=0)


def test_a_cpu_run_reports_params_grads_optimizer_state_and_activations(tmp_path):
    result = run(tiny(**ONE_STEP))
    with built(tiny()) as ctx:
        model = ctx.base_model
        n_params = sum(p.numel() for p in model.parameters())
        n_tensors = len(list(model.parameters()))
        assert result.params_bytes == storage_bytes([*model.parameters(), *model.buffers()])
    assert result.grads_bytes == 4 * n_params  # fp32 gradients, the tied embedding once
    assert result.optimizer_state_bytes == 8 * n_params + 4 * n_tensors  # AdamW: two moments and a step counter
    parts = result.memory_breakdown()
    assert parts["peak"] == result.peak_mem_bytes
    assert parts["activations"] > parts["params"]  # at 8 × 64 tokens the tiny GPT's activations dominate
    result.to_json(tmp_path / "r.json")
    saved = json.loads((tmp_path / "r.json").read_text())
    assert {k: saved[k] for k in ("params_bytes", "grads_bytes")} == {"params_bytes": result.params_bytes,
                                                                     "grads_bytes": result.grads_bytes}


def test_without_a_memory_probe_there_is_no_breakdown_and_the_figure_says_so():
    result = run(tiny(measure_memory=False, **ONE_STEP))
    assert result.peak_mem_bytes is None and result.memory_breakdown() is None
    with pytest.raises(ValueError, match="no measured memory breakdown.*measure_memory=True"):
        memory_breakdown_figure([result])


def test_stacked_bar_of_measured_and_planned_memory():
    result = run(tiny(**ONE_STEP))
    planned = estimate(tiny())
    fig = memory_breakdown_figure([result, planned])
    bars = [t for t in fig.data if t.type == "bar"]
    assert [b.name for b in bars] == ["parameters", "gradients", "optimizer state", "activations (peak − the rest)"]
    assert fig.layout.barmode == "stack"
    assert list(bars[0].x) == [f"{result.label} (measured)", f"{planned.label} (planned)"]
    for bar, part in zip(bars, PARTS, strict=True):
        assert list(bar.y) == pytest.approx([result.memory_breakdown()[part] / 2**20,
                                             planned.memory_breakdown()[part] / 2**20])
    single = memory_breakdown_figure(("by hand", {"params": 2**20, "grads": 0, "optimizer_state": 0,
                                                  "activations": 2**21}))
    assert [t.y[0] for t in single.data if t.type == "bar"] == [1.0, 0.0, 0.0, 2.0]
