"""`scalekit ladder data`: the data-bound baseline, then each data toggle cumulatively; the wait for data in the
terminal table and in the Lab."""

from __future__ import annotations

import json

import pytest

from scalekit import RunConfig, run
from scalekit.cli.main import main
from scalekit.training.ladder import LADDERS, TABLE_THROUGHPUT, data_ladder, data_rungs
from scalekit.training.report import results_table
from tests.helpers import CPU

QUICK = dict(preset="tiny", device="cpu", steps=5, warmup_steps=1, log_every=2, measure_memory=False)
LABELS = ["baseline", f"+ dataloader_num_workers={max(1, min(4, CPU.cpu_count // 2))}", "+ dataloader_pin_memory",
          "+ non_blocking", "+ training_format", "+ vectorized_transforms", "+ data_echo=2"]


@pytest.mark.slow
def test_the_data_ladder_climbs_every_data_toggle_cumulatively_from_raw_text(tmp_path, capsys):
    assert LADDERS["data"] is data_ladder and TABLE_THROUGHPUT["data"] == "wall"
    out = tmp_path / "data.json"
    code = main(["ladder", "data", "--preset", "tiny", "--device", "cpu", "--steps", "5", "--warmup-steps", "1",
                 "--log-every", "2", "--transform-rounds", "1", "--repeats", "1", "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "tokens/s (wall)" in printed and "data wait" in printed and "skipped" in printed
    results = json.loads(out.read_text())
    assert [r["label"] for r in results] == LABELS
    skipped = [r for r in results if r["status"] == "skipped"]
    assert [r["label"] for r in skipped] == ["+ dataloader_pin_memory", "+ non_blocking"]
    assert all("CPU" in r["error"] for r in skipped)
    ran = [r for r in results if r["status"] != "skipped"]
    assert all(r["status"] == "ok" and r["data_wait_frac"] is not None for r in ran), [r["error"] for r in ran]
    assert ran[0]["config"]["data"] == "shakespeare-raw" and ran[0]["config"]["toggles"] == {}
    assert ran[-1]["config"]["toggles"] == dict(data_rungs(CPU)[0:1], training_format=True,
                                                vectorized_transforms=True, data_echo=2)
    assert ran[-1]["steps_per_batch"] == 2 and ran[0]["steps_per_batch"] == 1  # 6 steps, 3 batches fetched


def test_a_wall_throughput_table_quotes_measured_tokens_over_wall_time():
    base = run(RunConfig(**QUICK, data="shakespeare-raw", transform_rounds=1))
    table = results_table([base, base], throughput="wall")
    assert "tokens/s (wall)" in table and f"{base.tokens_per_s_wall:,.0f}" in table and "1.00×" in table
    with pytest.raises(ValueError, match="throughput must be 'median' or 'wall'"):
        results_table([base], throughput="mean")


def test_the_lab_shows_the_wait_for_data_beside_compute():
    pytest.importorskip("ipywidgets")
    from scalekit import Lab

    lab = Lab(preset="tiny", steps=4, device="cpu", hw=CPU, warmup_steps=1, log_every=2, data="shakespeare-raw",
              transform_rounds=1)
    lab.run_button.click()
    result = lab.wait(120)
    assert result.status == "ok"
    wait_bar, compute_bar = lab.time_bar.data[0], lab.time_bar.data[1]
    measured = [s for s in result.steps if not s.warmup]
    mean_wait = sum(s.data_wait_ms for s in measured) / len(measured)
    assert wait_bar.name == "waiting for data" and list(wait_bar.x) == ["#1 baseline"]
    assert wait_bar.y[0] == pytest.approx(mean_wait)
    assert wait_bar.y[0] + compute_bar.y[0] == pytest.approx(sum(s.step_ms for s in measured) / len(measured))
    assert "waiting for data" in lab.table.value
    assert lab.results["data_wait_frac"].iloc[0] == pytest.approx(result.data_wait_frac)
