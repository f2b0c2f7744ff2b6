"""The Lab widget, driven headlessly: set controls, press Run and Stop, read the table and the figures."""

from __future__ import annotations

import dataclasses
import html
import json
import re
import time

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("ipywidgets", reason="the Lab needs ipywidgets (a scalekit dependency)")
pytest.importorskip("plotly", reason="the Lab needs plotly (a scalekit dependency)")

import ipywidgets as w  # noqa: E402

from scalekit import ConfigError, Lab, RunConfig, detect, run  # noqa: E402
from scalekit.toggles import ORDER, TOGGLES, exclusions  # noqa: E402
from scalekit.toggles.base import Toggle  # noqa: E402
from scalekit.widgets.panel import TogglePanel  # noqa: E402

FAST = dict(warmup_steps=1, log_every=2)  # few steps, frequent sync points: quick runs with several points


class Counting:
    """A tiny regression model for the Lab's own-model path; its loss can fail or press Stop on demand."""

    def __init__(self, fail_with: BaseException | None = None, stop_on_call: int | None = None,
                 sleep_first_s: float = 0.0):
        self.fail_with, self.stop_on_call, self.sleep_first_s = fail_with, stop_on_call, sleep_first_s
        self.calls = 0
        self.calls_at_stop = None
        self.lab = None

    def kwargs(self) -> dict:
        return dict(model=torch.nn.Linear(8, 1), batch_fn=self.batch_fn, loss_fn=self.loss_fn)

    def batch_fn(self, batch_size, device):
        return torch.randn(batch_size, 8, device=device), torch.randn(batch_size, 1, device=device)

    def loss_fn(self, model, batch):
        self.calls += 1
        if self.fail_with is not None:
            raise self.fail_with
        if self.calls == 1 and self.sleep_first_s:
            time.sleep(self.sleep_first_s)
        if self.calls == self.stop_on_call:
            self.calls_at_stop = self.calls
            self.lab.stop_button.click()  # a user pressing Stop while this step runs
        x, y = batch
        return F.mse_loss(model(x), y)


@pytest.fixture(scope="module")
def cpu():
    return detect("cpu")


def test_panel_has_one_control_per_toggle_from_order(cpu):
    lab = Lab(preset="tiny", device="cpu", hw=cpu)
    covered = [n for c in lab.controls.values() for n in c.names]
    # every toggle of the training loop, once, none hard-coded (generation toggles are in Lab(task="generate"))
    assert sorted(covered) == sorted(t.name for t in ORDER if "train" in t.loops)
    for control in lab.controls.values():
        if len(control.names) == 1:
            toggle = TOGGLES[control.names[0]]
            assert isinstance(control.widget, w.Checkbox if toggle.choices is None else w.Dropdown)
    pairs = {frozenset((a, b)) for a, b, _ in exclusions()}
    for control in lab.controls.values():  # one control holds only toggles that all exclude each other
        assert all(frozenset((a, b)) in pairs for a in control.names for b in control.names if a != b)
    assert lab.controls["precision"].names == ("bf16", "fp16")
    precision = lab.controls["precision"]
    assert [label for label, _ in precision.widget.options] == ["fp32", "bf16", "fp16"]
    assert precision.widget.index == 0 and precision.widget.label == "fp32"  # shown, not a blank box
    assert lab.panel.selected() == {} and lab.config().label == "baseline"
    lab.set(precision="fp16", compile="max-autotune", sdpa=True)
    assert lab.panel.selected() == {"fp16": True, "compile": "max-autotune", "sdpa": True}
    assert lab.config().toggles == {"sdpa": True, "compile": "max-autotune", "fp16": True}
    lab.set(precision=False, compile="off")
    assert lab.config().toggles == {"sdpa": True}
    with pytest.raises(KeyError, match="precision"):
        lab.set(fp32=True)
    with pytest.raises(ConfigError, match="bf16"):
        lab.set(precision="int3")
    with pytest.raises(ConfigError, match="tf32.*CPU"):
        lab.set(tf32=True)  # unavailable here: refused with the reason, like the disabled checkbox


def test_unavailable_toggle_is_disabled_and_says_why(cpu):
    no_tf32_no_bf16 = dataclasses.replace(cpu, tf32_supported=False, bf16_supported=False,
                                          device_name="Old GPU", capability=(7, 0))
    lab = Lab(preset="tiny", device="cpu", hw=no_tf32_no_bf16)
    for toggle in (t for t in ORDER if "train" in t.loops):  # disabled exactly when unavailable, reason beside
        # the Lab launches the ranks a toggle like ddp needs: it asks such toggles as a rank would be asked
        ask = toggle.available_in_ranks if toggle.needs_process_group else toggle.available
        ok, why = ask(no_tf32_no_bf16)
        control = next(c for c in lab.controls.values() if toggle.name in c.names)
        if len(control.names) == 1:
            assert control.widget.disabled is (not ok)
        if not ok:
            assert why in control.note.value.replace("&#x27;", "'")
    assert lab.controls["tf32"].widget.disabled
    assert "unavailable" in lab.controls["tf32"].note.value
    # bf16 unavailable: left out of the precision dropdown, which still offers fp32 and fp16
    assert [label for label, _ in lab.controls["precision"].widget.options] == ["fp32", "fp16"]
    assert "bf16 unavailable" in lab.controls["precision"].note.value


def test_own_model_disables_the_toggles_that_do_not_apply_with_applicables_reasons(cpu):
    from scalekit import applicable

    lab = Lab(device="cpu", hw=cpu, **Counting().kwargs())
    table = applicable(lab.base_config, hw=cpu)
    for toggle in ORDER:
        if "train" not in toggle.loops or toggle.name not in lab.controls:
            continue
        status, reason = table.status(toggle.name, "train")
        control = lab.controls[toggle.name]
        if status == "does not apply":  # the panel says what scalekit.applicable says, word for word
            assert control.widget.disabled and html.escape(reason) in control.note.value, toggle.name
    assert "needs an attention switch, which your model (Linear) does not have" in lab.controls["sdpa"].note.value
    assert "batches your batch_fn makes" in lab.controls["dataloader_num_workers"].note.value


def test_toggles_with_modes_get_dropdowns_built_generically(cpu):
    class Accumulate(Toggle):
        name, summary, group, phase, choices = "accum_probe", "split the batch", "memory", "step", (2, 4, 8)

    class Sharded(Toggle):
        name, summary, group, phase, choices = "shard_probe", "shard", "kernels", "wrap", ("full", "grad_op")

    class Replicated(Toggle):
        name, summary, group, phase = "replicate_probe", "replicate", "kernels", "wrap"

    toggles = (*ORDER, Accumulate(), Sharded(), Replicated())
    panel = TogglePanel(cpu, toggles=toggles, exclusive=(*exclusions(), ("shard_probe", "replicate_probe", "")))
    control = panel.controls["accum_probe"]
    assert isinstance(control.widget, w.Dropdown)
    assert [v for _, v in control.widget.options] == ["off", 2, 4, 8]
    assert control.widget.value == "off" and panel.selected() == {}
    control.set(4)
    assert panel.selected() == {"accum_probe": 4}
    parallel = panel.controls["kernels"]  # exclusive toggles, one of them with modes: one dropdown
    assert [label for label, _ in parallel.widget.options] == ["off", "full", "grad_op", "replicate_probe"]
    parallel.set("grad_op")
    assert panel.selected() == {"accum_probe": 4, "shard_probe": "grad_op"}
    parallel.set("replicate_probe")
    assert panel.selected() == {"accum_probe": 4, "replicate_probe": True}


def test_two_runs_fill_the_table_and_overlay_traces(cpu, tmp_path):
    lab = Lab(preset="tiny", steps=6, device="cpu", hw=cpu, **FAST)
    lab.run_button.click()
    assert lab.run_button.disabled and not lab.stop_button.disabled  # while it runs
    first = lab.wait(60)
    lab.set(sdpa=True)
    lab.run_button.click()
    second = lab.wait(60)
    assert (first.status, second.status) == ("ok", "ok")
    assert not lab.run_button.disabled and lab.stop_button.disabled

    df = lab.results
    assert list(df["run"]) == ["baseline", "sdpa"]
    assert list(df["#"]) == [1, 2]
    assert df["tokens_per_s"].tolist() == [first.tokens_per_s, second.tokens_per_s]
    assert df["step_ms"].tolist() == [first.step_ms.median, second.step_ms.median]
    assert df["speedup"][0] == 1.0
    assert df["speedup"][1] == pytest.approx(second.tokens_per_s / first.tokens_per_s)
    assert df["mem_ratio"][1] == pytest.approx(second.peak_mem_bytes / first.peak_mem_bytes)
    assert df["final_loss"].tolist() == [first.final_loss, second.final_loss]
    assert lab.table.value.count("<tr>") == 3  # header and two runs

    for fig_key in ("throughput", "memory", "loss"):
        assert lab.plots.trace_names(fig_key) == ["#1 baseline", "#2 sdpa"]
    for trace, result in zip(lab.plots.throughput.data, (first, second), strict=True):
        assert list(trace.x) == [s.step for s in result.steps]
        assert list(trace.y) == [s.tokens_per_s for s in result.steps]
        assert len(trace.x) == 1 + 6  # warm-up and measured steps
    for trace, result in zip(lab.plots.loss.data, (first, second), strict=True):
        assert list(zip(trace.x, trace.y, strict=True)) == result.losses

    # the stacked memory bars: one bar per run, one trace per part, heights the measured bytes in MiB
    bars = [t for t in lab.memory_bar.data if t.type == "bar"]
    assert [t.name for t in bars] == ["parameters", "gradients", "optimizer state", "activations (peak − the rest)"]
    assert list(bars[0].x) == ["#1 baseline", "#2 sdpa"]
    assert list(bars[3].y) == pytest.approx([r.activations_bytes / 2**20 for r in (first, second)])
    assert sum(t.y[1] for t in bars) == pytest.approx(second.peak_mem_bytes / 2**20)

    # the Lab measures what run() measures: same config, same losses
    direct = run(dataclasses.replace(lab.base_config, toggles={"sdpa": True}, batch_size=8), hw=cpu)
    assert direct.losses == second.losses


def test_stop_ends_the_run_within_one_step_and_keeps_it(cpu):
    model = Counting(stop_on_call=5)
    lab = Lab(steps=1000, device="cpu", hw=cpu, **FAST, **model.kwargs())
    model.lab = lab
    lab.run_button.click()
    result = lab.wait(60)
    assert result.status == "stopped"
    assert model.calls == model.calls_at_stop  # no step began after Stop was pressed
    assert 0 < len(result.steps) < 1001
    row = lab.results.iloc[-1]
    assert row["status"] == "stopped" and row["tokens_per_s"] == result.tokens_per_s
    assert "stopped" in lab.message.value
    # and the Lab goes on
    model.stop_on_call = None
    lab.steps.value = 4
    lab.run_button.click()
    assert lab.wait(60).status == "ok"
    assert lab.results["status"].tolist() == ["stopped", "ok"]


def test_stop_button_responds_while_a_run_goes(cpu):
    lab = Lab(preset="tiny", steps=100_000, device="cpu", hw=cpu, **FAST)
    lab.run_button.click()
    deadline = time.monotonic() + 30
    while lab._steps_seen < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lab.running and not lab.start()  # a second Run while one goes is refused
    lab.stop_button.click()
    t0 = time.perf_counter()
    result = lab.wait(30)
    assert time.perf_counter() - t0 < 5  # a tiny step is milliseconds; Stop does not wait for 100k of them
    assert result.status == "stopped" and len(result.steps) < 100_000
    assert lab.results["status"].tolist() == ["stopped"]
    assert lab.plots.trace_names() == ["#1 baseline"]


def test_a_failed_run_is_shown_in_words_and_the_lab_stays_usable(cpu):
    model = Counting(fail_with=torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB"))
    lab = Lab(steps=4, device="cpu", hw=cpu, **FAST, **model.kwargs())
    lab.run_button.click()
    failed = lab.wait(60)
    assert failed.status == "failed"
    assert "out of memory" in lab.message.value and "Tried to allocate 80.00 GiB" in lab.message.value
    assert not lab.run_button.disabled and lab.stop_button.disabled
    assert len(lab.results) == 0 and lab.plots.trace_names() == []
    assert lab.log.outputs == ()  # handled, not a traceback

    model.fail_with = None
    lab.run_button.click()
    ok = lab.wait(60)
    assert ok.status == "ok"
    assert lab.results["#"].tolist() == [2]
    assert lab.plots.trace_names() == ["#2 baseline"]


def test_exclusion_is_not_taken_as_transitive(cpu):
    class A(Toggle):
        name, summary, group, phase = "a_probe", "a", "memory", "step"

    class B(Toggle):
        name, summary, group, phase = "b_probe", "b", "memory", "step"

    class C(Toggle):
        name, summary, group, phase = "c_probe", "c", "memory", "step"

    # a excludes b, b excludes c, but a and c go together: a/b share a dropdown, c stays its own control
    pairs = (("a_probe", "b_probe", "both x"), ("b_probe", "c_probe", "both y"))
    panel = TogglePanel(cpu, toggles=(A(), B(), C()), exclusive=pairs)
    assert sorted(c.names for c in panel.controls.values()) == [("a_probe", "b_probe"), ("c_probe",)]
    panel.controls["memory"].set("a_probe")
    panel.controls["c_probe"].set(True)
    assert panel.selected() == {"a_probe": True, "c_probe": True} and panel.conflicts() == []
    panel.controls["memory"].set("b_probe")
    assert panel.conflicts() == ["b_probe and c_probe cannot be on together: both y"]


def test_a_refused_combination_is_shown_and_nothing_runs(cpu):
    lab = Lab(device="cpu", hw=cpu, **Counting().kwargs())
    sdpa = lab.controls["sdpa"].widget
    sdpa.disabled, sdpa.value = False, True  # forced past the disabled checkbox, as code could
    assert lab.start() is False
    assert "Cannot run this combination" in lab.message.value and "sdpa" in lab.message.value
    assert lab.runs == [] and not lab.running and not lab.run_button.disabled


def test_progress_shows_while_a_slow_first_step_runs(cpu):
    model = Counting(sleep_first_s=2.6)
    lab = Lab(steps=3, device="cpu", hw=cpu, **FAST, **model.kwargs())
    seen = []
    lab.status.observe(lambda change: seen.append(change["new"]), names="value")
    lab.run_button.click()
    result = lab.wait(60)
    assert result.status == "ok"
    assert any(re.search(r"— \d+ s$", s) for s in seen), seen  # an elapsed-seconds tick: not hung
    assert lab.progress.value == lab.progress.max == 1 + 3


def test_live_view_is_throttled(cpu):
    lab = Lab(preset="tiny", steps=60, device="cpu", hw=cpu, updates_per_s=4, warmup_steps=1, log_every=1)
    lab.run_button.click()
    lab.wait(60)
    cost = lab.view_costs[1]
    assert 1 <= cost.updates <= cost.run_wall_s * 4 + 2
    assert cost.fraction < 0.05, cost  # a sanity bound; benchmarks/lab_overhead.py measures it properly


def test_results_export_to_csv_and_json(cpu, tmp_path):
    lab = Lab(preset="tiny", steps=3, device="cpu", hw=cpu, **FAST)
    lab.start()
    lab.wait(60)
    lab.batch_size.value = 4
    lab.start()
    result = lab.wait(60)
    assert result.label == "baseline (batch 4)" and result.tokens_per_step == 4 * 64
    table = lab.results
    back = pd.read_csv(lab.to_csv(tmp_path / "lab.csv"))
    assert back["run"].tolist() == table["run"].tolist()
    assert back["tokens_per_s"].tolist() == pytest.approx(table["tokens_per_s"].tolist())
    assert back["batch_size"].tolist() == [8, 4]
    lab.to_json(tmp_path / "lab.json")
    doc = json.loads((tmp_path / "lab.json").read_text())
    assert [r["tokens_per_s"] for r in doc["results"]] == pytest.approx(table["tokens_per_s"].tolist())
    assert len(doc["runs"][1]["steps"]) == len(result.steps)


def test_bad_arguments_fail_early_with_the_field_named(cpu):
    with pytest.raises(ConfigError, match="preset"):
        Lab(preset="huge")
    with pytest.raises(ConfigError, match="steps"):
        Lab(preset="tiny", steps=0)
    with pytest.raises(ConfigError, match="updates_per_s"):
        Lab(preset="tiny", updates_per_s=0)
    with pytest.raises(ConfigError, match="tf32.*CPU"):
        Lab(preset="tiny", hw=cpu, toggles=["tf32"])


def test_toggles_given_to_the_lab_start_switched_on(cpu):
    lab = Lab(preset="tiny", hw=cpu, toggles={"bf16": True, "compile": "max-autotune", "sdpa": True})
    assert lab.controls["precision"].widget.value == "bf16"
    assert lab.controls["compile"].widget.value == "max-autotune"
    assert lab.controls["sdpa"].widget.value is True
    assert lab.config().toggles == {"sdpa": True, "compile": "max-autotune", "bf16": True}
    assert isinstance(Lab(preset="tiny", device="cpu").base_config, RunConfig)


def test_select_shows_exactly_the_given_toggles(cpu):
    lab = Lab(preset="tiny", steps=2, device="cpu", hw=cpu, **FAST)
    lab.set(sdpa=True)
    lab.select({"bf16": True, "fused_adamw": True, "compile": "default"})
    assert lab.panel.selected() == {"bf16": True, "fused_adamw": True, "compile": "default"}
    with pytest.raises(ConfigError, match="unknown toggle 'warp'"):
        lab.select(["warp"])
