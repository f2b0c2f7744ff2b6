"""plan_for(run_top=k): the k best plans for this machine's ranks run for real (2 gloo ranks, as autotune runs its
candidates), their measured step beside the predicted one."""

from __future__ import annotations

import time

from scalekit.predict import PARTS, calibrate, plan_for
from tests.forking import no_process_left_behind  # noqa: F401 - the same deadline and cleanup here


def test_the_top_plans_run_on_two_ranks_and_are_measured_against_their_prediction():
    calibrate(ranks=2, matmul_sizes=(32, 64, 128), copy_mbytes=4, message_sizes=(2**12, 2**16), repeats=2,
              threads=1)
    try:
        start = time.perf_counter()
        s = plan_for("tiny", "2xthis-cpu", batch_size=4, run_top=2, run_steps=6)
        took = time.perf_counter() - start
        assert len(s.plans) >= 10 and took < 240
        assert len(s.measured) + sum("did not run" in n or "measured no step" in n for n in s.notes) == 2
        assert s.measured, s.notes
        for m, r in zip(s.measured, s.plans, strict=False):
            assert m["plan"] == r.plan.label and m["toggles"] == r.plan.toggles()
            assert m["predicted_ms"] == r.prediction.step_s * 1e3 and m["measured_ms"] > 0
            assert m["ratio"] == m["predicted_ms"] / m["measured_ms"]
        assert "measured: " + s.measured[0]["plan"] in str(s)
        print(f"\nrun_top=2 on 2 gloo ranks in {took:.1f} s: "
              + "; ".join(f"{m['plan']}: predicted {m['predicted_ms']:.1f} ms, measured {m['measured_ms']:.1f} ms"
                          for m in s.measured))
    finally:
        PARTS.pop("this-cpu", None)
