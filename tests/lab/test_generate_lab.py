"""The Lab's generation mode, driven headlessly: inference toggles, Run/Stop, live plots, the text, the table."""

from __future__ import annotations

import json
import time

import pytest
import torch

pytest.importorskip("ipywidgets", reason="the Lab needs ipywidgets (a scalekit dependency)")
pytest.importorskip("plotly", reason="the Lab needs plotly (a scalekit dependency)")

import ipywidgets as w  # noqa: E402

from scalekit import ConfigError, Lab, ToggleUnavailable, detect  # noqa: E402
from scalekit.inference import GenerateConfig, generate  # noqa: E402
from scalekit.toggles import ORDER  # noqa: E402
from scalekit.widgets.generate_lab import GenerateLab  # noqa: E402
from tests.helpers import one_thread  # noqa: E402

QUICK = dict(measure_memory=False, warmup_tokens=0, quality_windows=2)


@pytest.fixture(scope="module")
def cpu():
    return detect("cpu")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


def test_the_panel_holds_the_generation_toggles_and_leaves_out_modes_that_cannot_run(cpu):
    lab = Lab(task="generate", device="cpu", hw=cpu, **QUICK)
    assert isinstance(lab, GenerateLab)
    assert sorted(lab.controls) == sorted(t.name for t in ORDER if "generate" in t.loops)
    quantize = lab.controls["quantize"]
    offered = [v for _, v in quantize.widget.options]
    assert "hqq-4bit" in offered and "gptq" not in offered and "awq" not in offered
    assert "not here: gptq" in quantize.note.value and "CUDA" in quantize.note.value
    assert isinstance(lab.controls["kv_cache"].widget, w.Dropdown)
    with pytest.raises(ConfigError, match="gptq"):
        lab.set(quantize="gptq")
    with pytest.raises(ToggleUnavailable, match="tf32"):
        lab.set(tf32=True)
    with pytest.raises(ConfigError, match="Lab.task"):
        Lab(task="serve")


def test_runs_stream_text_and_points_and_fill_the_table_with_quality(cpu, tmp_path):
    lab = Lab(task="generate", max_new_tokens=40, device="cpu", hw=cpu, **QUICK)
    lab.set(kv_cache="static")
    lab.run_button.click()
    assert lab.run_button.disabled and not lab.stop_button.disabled
    first = lab.wait(120)
    lab.set(quantize="hqq-4bit")
    lab.start()
    second = lab.wait(120)
    assert (first.status, second.status) == ("ok", "ok")
    assert not lab.run_button.disabled and lab.stop_button.disabled
    df = lab.results
    assert df["run"].tolist() == ["kv_cache=static", "kv_cache=static + quantize=hqq-4bit"]
    assert df["decode_tokens_per_s"].tolist() == [first.decode_tokens_per_s, second.decode_tokens_per_s]
    assert df["agreement"].tolist() == [1.0, second.agreement] and second.agreement < 1
    assert df["weight_mb"][1] < df["weight_mb"][0] and df["perplexity"].notna().all()
    assert lab.table.value.count("<tr>") == 3
    assert lab.plots.trace_names("latency") == ["#1 kv_cache=static", "#2 kv_cache=static + quantize=hqq-4bit"]
    for trace, result in zip(lab.plots.latency.data, (first, second), strict=True):
        assert list(trace.x) == list(range(1, 40)) and len(trace.y) == len(result.token_ms)
    assert second.texts[0].replace("&", "") in lab.text.value.replace("&#x27;", "'").replace("&", "")
    assert lab.progress.value == 40
    # the Lab measures what generate() measures: the same tokens
    direct = generate(GenerateConfig(max_new_tokens=40, toggles={"kv_cache": "static"}, device="cpu", **QUICK), hw=cpu)
    assert direct.token_ids == first.token_ids
    back = json.loads(open(lab.to_json(tmp_path / "g.json")).read())
    assert [r["run"] for r in back["results"]] == df["run"].tolist() and len(back["runs"]) == 2


def test_stop_ends_the_generation_and_keeps_it(cpu):
    lab = Lab(task="generate", max_new_tokens=1000, device="cpu", hw=cpu, **QUICK)
    lab.start()
    deadline = time.monotonic() + 60
    while lab._tokens_seen < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lab.running and not lab.start()  # a second Run while one goes is refused
    lab.stop_button.click()
    result = lab.wait(60)
    assert result.status == "stopped" and 5 <= result.new_tokens < 1000
    assert lab.results["status"].tolist() == ["stopped"] and "stopped" in lab.message.value
    assert not lab.run_button.disabled


class Exploding(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(65, 65)

    def forward(self, idx):
        raise SystemExit("a model that exits")  # BaseException: caught by the Lab, not only Exception


def test_a_failing_generation_is_shown_in_words_and_the_controls_come_back(cpu):
    lab = Lab(task="generate", model=Exploding(), max_new_tokens=5, device="cpu", hw=cpu, **QUICK)
    lab.start()
    failed = lab.wait(60)
    assert failed.status == "failed" and "a model that exits" in failed.error
    assert "failed" in lab.message.value and "ready for the next run" in lab.message.value
    assert not lab.run_button.disabled and lab.stop_button.disabled and not lab.panel.controls["compile"].widget.disabled
    assert len(lab.results) == 0


def test_a_bad_prompt_is_refused_and_nothing_runs(cpu):
    lab = Lab(task="generate", device="cpu", hw=cpu, **QUICK)
    lab.prompt.value = "naïve"
    assert lab.start() is False
    assert "Cannot run this" in lab.message.value and "ï" in lab.message.value
    assert lab.runs == [] and not lab.running and not lab.run_button.disabled


def test_speculative_runs_show_the_draft_tokens_kept_per_verification_live(cpu):
    lab = Lab(task="generate", max_new_tokens=30, device="cpu", hw=cpu, **QUICK)
    lab.set(kv_cache="static", speculative="draft")
    lab.start()
    result = lab.wait(120)
    assert result.status == "ok", result.error
    lab.plots.flush()
    assert lab.plots.trace_names("accepted") == ["#1 kv_cache=static + speculative=draft"]
    kept = list(lab.plots.accepted.data[0].y)
    assert len(kept) == 29 and set(kept) <= {0, 1, 2, 3, 4} and sum(result.accepted_counts) > 0
    assert lab.results["acceptance"].tolist() == [result.acceptance_rate]
