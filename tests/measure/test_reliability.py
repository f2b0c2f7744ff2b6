"""The one rule that makes a verdict unreliable (measure/reliability.py), for the way the alternating calls of
call_finding are measured: one load over both sides, kept as paired rounds keep theirs; too wide always."""

from scalekit.measure.load import MachineLoad
from scalekit.measure.reliability import WIDE_RATIO, judged_sentence, unreliable_reason
from scalekit.measure.stats import ALTERNATING, Interval, figures

BUSY = MachineLoad(other_cpu_cores=1.5, cores=2, wall_s=1.0)


def test_alternating_calls_on_a_busy_machine_keep_the_verdict_and_name_the_one_load():
    narrow = Interval(1.30, 1.20, 1.41, method=ALTERNATING, busy=True)
    assert unreliable_reason(narrow, BUSY, BUSY, "sdpa", "eager") == ("", "")
    assert judged_sentence("sdpa", narrow, "eager", BUSY, BUSY) == (
        "sdpa is faster than eager: 1.30× (1.20–1.41× at 95%, calls alternating); the machine was busy (the calls "
        "alternated, so the load fell on both); other processes used 1.50 of 2 cores while sdpa and eager were timed")


def test_alternating_calls_too_wide_are_unreliable_and_still_name_the_load():
    wide = Interval(3.98, 0.08, 197.17, method=ALTERNATING, busy=True)  # chapter 03's compiled RMSNorm, once
    short, detail = unreliable_reason(wide, BUSY, BUSY, "compiled RMSNorm", "eager")
    assert short == "interval too wide" and f"more than {WIDE_RATIO:g}" in detail
    said = judged_sentence("compiled RMSNorm", wide, "eager", BUSY, BUSY)
    assert said.startswith("compiled RMSNorm against eager: unreliable (interval too wide), 3.98× (0.08–197.17× at "
                           "95%, calls alternating); its ends differ by a factor of 2464.6")
    assert "; the machine was busy: other processes used 1.50 of 2 cores while compiled RMSNorm and eager were " \
           "timed; time more calls of each" in said
    assert "within noise" not in said and "faster" not in said


def test_the_figures_say_how_the_interval_was_measured():
    assert figures(Interval(1.3, 1.2, 1.4, rounds=3)) == "1.30× (1.20–1.40× at 95%, 3 rounds)"
    assert figures(Interval(1.3, 1.2, 1.4, method="one run each")).endswith("at 95%, one run each)")
    assert figures(Interval(1.3, 1.2, 1.4, method=ALTERNATING)).endswith("at 95%, calls alternating)")
