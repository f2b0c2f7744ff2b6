"""The decode-growth figure of chapter 06: cumulative decode time and KV bytes against tokens generated."""

from types import SimpleNamespace

import pytest

pytest.importorskip("plotly")

from scalekit.course.figures import decode_growth_figure  # noqa: E402


def test_cumulative_time_and_kv_bytes_per_generation():
    runs = [SimpleNamespace(label="no cache", token_ms=[1.0, 2.0, 3.0]),
            SimpleNamespace(label="kv_cache=dynamic", token_ms=[1.0, 1.0, 1.0])]
    fig = decode_growth_figure(runs, {"kv_cache=dynamic": [2**20, 2 * 2**20, 3 * 2**20, 4 * 2**20]})
    time_traces = [t for t in fig.data if t.xaxis in (None, "x")]
    kv_traces = [t for t in fig.data if t.xaxis == "x2"]
    assert [t.name for t in time_traces] == ["no cache", "kv_cache=dynamic"]
    assert list(time_traces[0].y) == pytest.approx([0.001, 0.003, 0.006])  # seconds, added up
    assert list(time_traces[0].x) == [2, 3, 4]  # decode step i makes token i + 1
    assert len(kv_traces) == 1 and list(kv_traces[0].y) == [1, 2, 3, 4]  # MiB, only where bytes were given
