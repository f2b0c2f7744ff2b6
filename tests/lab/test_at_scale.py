"""The Lab's "at scale" view, driven headlessly: it builds, a change of a control predicts again (the figures' data
are a direct scalekit.predict call's numbers), a refusal shows its sentence, and a Lab's latest run sits beside the
prediction (or the view says this-cpu is not calibrated)."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("ipywidgets", reason="the at-scale view needs ipywidgets (a scalekit dependency)")
pytest.importorskip("plotly", reason="the at-scale view needs plotly (a scalekit dependency)")

from scalekit import ConfigError, Lab, detect  # noqa: E402
from scalekit.measure.timing import Spread  # noqa: E402
from scalekit.predict import PARTS, predict  # noqa: E402
from scalekit.training.results import RunResult  # noqa: E402
from scalekit.widgets import AtScale  # noqa: E402
from scalekit.widgets.at_scale import GIB, MEMORY_PARTS, timeline_rows  # noqa: E402


def bars(view) -> dict[str, dict[str, float]]:
    """{memory part: {bar: GiB}} as the memory figure holds them."""
    return {t.name: dict(zip(t.x, t.y, strict=True)) for t in view.memory_figure.data if t.type == "bar"}


def timeline(view) -> dict[str, float]:
    return {t.name: t.x[0] for t in view.timeline.data if t.y[0] == "predicted"}


def test_the_view_builds_and_its_figures_are_a_direct_predict_calls():
    view = AtScale("llama3-8b", gpus="8xH100-SXM", toggles={"fsdp": True, "bf16": True, "checkpointing": "selective"},
                   batch_size=8, seq_len=4096)
    direct = predict("llama3-8b", "8xH100-SXM", toggles={"fsdp": True, "bf16": True, "checkpointing": "selective"},
                     batch_size=8, seq_len=4096)
    assert view.toggles() == {"fsdp": True, "bf16": True, "checkpointing": "selective"} and view.refusal == ""
    assert {name: b["predicted"] for name, b in bars(view).items()} == pytest.approx(
        {label: direct.memory[key] / GIB for key, label in MEMORY_PARTS})
    capacity = next(t for t in view.memory_figure.data if t.type == "scatter")
    assert capacity.y[0] == pytest.approx(direct.capacity_bytes / GIB)
    assert timeline(view) == pytest.approx(timeline_rows(direct))  # compute, each exposed collective, bubble
    assert any("all_gather" in name for name in timeline(view)) and "bubble" in timeline(view)
    assert "fits: " in view.verdict.value and f"{direct.tokens_per_s_per_gpu:,.0f} tokens/s per GPU" in view.verdict.value
    assert "assumptions" in view.assumptions.value and "Korthikanti" in view.assumptions.value
    assert set(view.part.options) == set(PARTS)


def test_changing_a_control_predicts_again():
    view = AtScale("llama3-8b", gpus="8xH100-SXM", toggles={"fsdp": True, "bf16": True}, batch_size=16, seq_len=2048)
    view.count.value = 16
    view.tensor.value = 2
    view.stages.value = 2
    view.micro_batches.value = 4
    view.part.value = "H200"
    toggles = {"fsdp": True, "tensor_parallel": 2, "pipeline_parallel": "1f1b/4,stages=2", "bf16": True}
    assert view.toggles() == toggles and view.gpus() == "16xH200"
    direct = predict("llama3-8b", "16xH200", toggles=toggles, batch_size=16, seq_len=2048)
    assert (view.prediction.layout.tp, view.prediction.layout.pp, view.prediction.layout.dp) == (2, 2, 4)
    assert {name: b["predicted"] for name, b in bars(view).items()} == pytest.approx(
        {label: direct.memory[key] / GIB for key, label in MEMORY_PARTS})
    assert timeline(view) == pytest.approx(timeline_rows(direct))
    assert timeline(view)["bubble"] > 0 and any("send_recv" in name for name in timeline(view))
    view.model.value = "gpt2-124m"
    assert view.prediction.model == "gpt2-124m"
    assert timeline(view) == pytest.approx(timeline_rows(predict("gpt2-124m", "16xH200", toggles=toggles,
                                                                 batch_size=16, seq_len=2048)))


def test_a_refusal_shows_its_sentence_and_no_figures():
    view = AtScale("llama3-8b", gpus="8xH100-SXM", batch_size=8)
    view.tensor.value = 3  # Llama 3 8B has 32 heads, 8 of them key/value
    assert view.prediction is None
    assert "tensor_parallel 3 does not divide the model's 32 attention heads" in view.refusal
    assert "tensor_parallel 3 does not divide" in view.verdict.value and not view.memory_figure.data
    view.tensor.value = 2
    view.batch_size.value = 6  # 4 data-parallel ranks cannot split 6 rows
    assert "batch_size 6 does not split into 4 data-parallel ranks" in view.verdict.value
    view.batch_size.value = 8
    assert view.prediction is not None and view.refusal == ""
    with pytest.raises(ConfigError, match="'compile' has no control in the at-scale view"):
        AtScale("llama3-8b", toggles=["compile"])


def measured(config: dict) -> RunResult:
    return RunResult(label="baseline", config=config, device="cpu", step_ms=Spread(median=12.5, p25=12.0, p75=13.0, min=12.0, max=13.5, n=5),
                     peak_mem_bytes=40 * 2**20, params_bytes=10 * 2**20, grads_bytes=10 * 2**20,
                     optimizer_state_bytes=15 * 2**20, activations_bytes=5 * 2**20)


def test_a_labs_latest_run_is_measured_beside_the_prediction(monkeypatch):
    lab = Lab(preset="tiny", device="cpu", hw=detect("cpu"))
    view = lab.at_scale(gpus="8xH100-SXM")
    assert view.model.value == "tiny" and "No run measured in this Lab yet" in view.measured.value
    result = measured(lab.config().resolve(lab.hw).to_dict())
    lab.runs.append((1, result))
    monkeypatch.delitem(PARTS, "this-cpu", raising=False)
    view.refresh()
    assert "step 12.50 ms, peak memory 40.0 MiB" in view.measured.value
    assert "this-cpu is not calibrated: run scalekit.calibrate()" in view.measured.value
    assert bars(view)["parameters"]["measured here"] == pytest.approx(10 / 1024)
    assert [t.x[0] for t in view.timeline.data if t.y[0] == "measured here"] == [12.5]
    # calibrated (here a stand-in part named this-cpu with the H100's figures, so that nothing is measured): the same
    # run predicted on it, beside the measurement
    monkeypatch.setitem(PARTS, "this-cpu", dataclasses.replace(PARTS["H100-SXM"], name="this-cpu"))
    lab._show_result(result)  # what the Lab does after each run: its at-scale views redrawn
    assert "this-cpu" in view.part.options and view.part.value == "H100-SXM"  # the part registered since, offered
    local = predict(lab.config().resolve(lab.hw), "1xthis-cpu")
    assert f"step {local.step_s * 1e3:,.2f} ms" in view.measured.value and "(calibrated)" in view.measured.value
    assert [t.x[0] for t in view.timeline.data if t.y[0] == "predicted here"] == pytest.approx([local.step_s * 1e3])
