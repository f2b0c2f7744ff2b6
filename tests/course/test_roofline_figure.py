"""The roofline figure draws each roof and each operator that does arithmetic, at its intensity."""

from scalekit.course.figures import roofline_figure
from scalekit.measure.roofline import OpCost, Roof


def test_the_roofline_figure_draws_roofs_and_points():
    roofs = [Roof("here", 100.0, 10.0), Roof("there", 1000.0, 20.0)]
    ops = [OpCost("mm", "2×2", "float32", 1, 80.0, 4.0, 1.0), OpCost("mul", "2", "float32", 2, 2.0, 8.0, 0.5),
           OpCost("copy_", "2", "float32", 1, 0.0, 8.0, 0.5)]
    fig = roofline_figure(roofs, {"model": ops}, overhead_s=0.0)
    lines = [t for t in fig.data if t.mode == "lines"]
    assert [t.name for t in lines] == ["here", "there"]
    assert max(lines[0].y) == 100.0 and 10.0 in lines[0].x  # flat from the ridge on
    (points,) = [t for t in fig.data if t.name == "model"]
    assert list(points.x) == [20.0, 0.25]  # the copy does no arithmetic: no point
    assert list(points.y) == [80.0, 4.0]
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
