"""scalekit.distributed.timeline (a pipeline's passes as recorded) and the figure drawn from it, without ranks: the
recorder around stand-ins for torch's stage methods, the timeline's arithmetic on passes written here.  The real
recording on 2 gloo ranks is chapter 13's (under nbval in the suite)."""

from __future__ import annotations

import pytest

from scalekit.distributed.timeline import Pass, Timeline, record_pipeline


def gpipe_step(t0: float, stages: int = 2, m: int = 2, ms: float = 1.0) -> list[Pass]:
    """An ideal GPipe step: forward of micro-batch b on stage s at (s + b), backwards in reverse, each `ms` long."""
    out, end_f = [], (stages + m - 1) * ms
    for s in range(stages):
        for b in range(m):
            start = t0 + (s + b) * ms
            out.append(Pass(s, s, "forward", b, start / 1e3, (start + ms) / 1e3))
            back = t0 + end_f + (stages - 1 - s + b) * ms
            out.append(Pass(s, s, "backward", b, back / 1e3, (back + ms) / 1e3))
    return out


def test_steps_span_and_idle_share_of_an_ideal_gpipe_step_follow_the_bubble():
    first, second = gpipe_step(0.0), gpipe_step(100.0)
    timeline = Timeline(sorted(first + second, key=lambda p: p.start_s))
    steps = timeline.steps()
    assert [len(s.passes) for s in steps] == [8, 8] and {p.start_s for p in steps[1].passes} == {
        p.start_s for p in second}
    step = steps[1]
    assert step.span_ms() == pytest.approx(6.0)  # 2 × (m + p - 1) passes of 1 ms
    assert step.idle_share() == pytest.approx(1 / 3)  # (p - 1) / (m + p - 1) with p = m = 2
    rows = step.rows()
    assert min(r["start_ms"] for r in rows) == 0 and max(r["end_ms"] for r in rows) == pytest.approx(6.0)
    assert timeline.typical_step().passes == steps[1].passes  # the warm-up step is never the one drawn
    assert Timeline().idle_share() == 0 and Timeline().rows() == [] and Timeline().gather().passes == []


def test_the_recorder_times_each_forward_and_backward_and_puts_torchs_methods_back(monkeypatch):
    from torch.distributed.pipelining.stage import _PipelineStageBase

    calls = []
    monkeypatch.setattr(_PipelineStageBase, "forward_one_chunk", lambda self, i, *a, **k: calls.append(("F", i)) or i)
    monkeypatch.setattr(_PipelineStageBase, "backward_one_chunk", lambda self, i, *a, **k: calls.append(("B", i)))
    forward, backward = _PipelineStageBase.forward_one_chunk, _PipelineStageBase.backward_one_chunk

    class Stage:
        stage_index = 1

    with record_pipeline() as timeline:
        assert _PipelineStageBase.forward_one_chunk(Stage(), 3, ()) == 3
        _PipelineStageBase.backward_one_chunk(Stage(), 3, loss=None)
    assert calls == [("F", 3), ("B", 3)]
    assert [(p.rank, p.stage, p.kind, p.micro_batch) for p in timeline.passes] == [(0, 1, "forward", 3),
                                                                                  (0, 1, "backward", 3)]
    assert all(p.end_s >= p.start_s for p in timeline.passes)
    assert _PipelineStageBase.forward_one_chunk is forward and _PipelineStageBase.backward_one_chunk is backward


def test_the_figure_draws_a_bar_per_pass_in_a_panel_per_schedule():
    from scalekit.course.figures import pipeline_timeline_figure

    step = Timeline(gpipe_step(0.0))
    fig = pipeline_timeline_figure({"gpipe, m=2": step, "again": step})
    bars = [t for t in fig.data if t.type == "bar"]
    assert len(bars) == 4 and sum(len(t.x) for t in bars) == 2 * len(step.passes)
    assert "idle 33%" in fig.layout.annotations[0].text
    assert sorted(set(bars[0].y)) == ["stage 0 (rank 0)", "stage 1 (rank 1)"]
