"""The table of predictions against published runs (scalekit/predict/published.py): every ratio is the prediction
over the published figure, the verdict follows the band, a miss names its missing term, and the 500 W H100's
throughput is an interval between its two possible peaks."""

from __future__ import annotations

import pytest

from scalekit.course.published_figures import GPT2_A100_LADDER_MS, TORCHTITAN_LLAMA31_8B_8XH100
from scalekit.predict.parts import part
from scalekit.predict.published import FLOOR_PART, Row, rows, table


@pytest.fixture(scope="module")
def published_rows():
    return rows()


def test_every_row_is_its_prediction_over_the_published_figure_with_the_verdict_its_band_gives(published_rows):
    assert len(published_rows) == 2 * len(TORCHTITAN_LLAMA31_8B_8XH100) + 5 + 2
    for r in published_rows:
        lo, hi = r.ratios
        assert hi == pytest.approx(r.predicted / r.published)
        assert r.within == (lo - 1 <= r.band and 1 - hi <= r.band)
        assert bool(r.missing) == (not r.within)  # a miss always names what the model lacks
    ladder = [r for r in published_rows if r.row.startswith("GPT-2")]
    assert [r.published for r in ladder] == [GPT2_A100_LADDER_MS[k] for k in
                                             ("+ bf16", "+ compile", "+ sdpa", "+ nice_numbers", "+ fused_adamw")]


def test_the_500w_part_is_predicted_at_both_ends_of_its_peak(published_rows):
    assert part(FLOOR_PART).peak("bf16") == part("H100-NVL").peak("bf16") < part("H100-96GB-500W").peak("bf16")
    for r in published_rows:
        if "tokens/s/GPU" in r.row:
            assert r.low is not None and r.low < r.predicted  # a lower peak, fewer tokens
            assert f"{r.low:,.0f}–{r.predicted:,.0f}" in table(published_rows)


def test_an_interval_is_within_when_any_point_of_it_is():
    inside = Row("s", "r", predicted=1.30, published=1.0, band=0.2, kind="decode", low=1.10)
    outside = Row("s", "r", predicted=1.45, published=1.0, band=0.2, kind="decode", low=1.25)
    assert inside.within and not outside.within and outside.missing
