"""When a finding must read 'unreliable' and say why: a pure function of the interval and the two runs' loads."""

from scalekit.course import unreliable_reason
from scalekit.measure.load import MachineLoad
from scalekit.measure.reliability import WIDE_RATIO
from scalekit.measure.stats import Interval


def load(cores_used: float | None) -> MachineLoad:
    return MachineLoad(other_cpu_cores=cores_used, cores=8, wall_s=5.0)


ONE_EACH = Interval(1.30, 1.20, 1.41, method="one run each")
ROUNDS = Interval(1.30, 1.20, 1.41, rounds=3, method="paired rounds")


def test_a_quiet_machine_and_a_narrow_interval_leave_the_verdict_alone():
    assert unreliable_reason(ONE_EACH, load(0.1), load(0.2)) == ("", "")
    assert unreliable_reason(None, load(0.1), load(3.0)) == ("", "")  # nothing compared: nothing to call unreliable


def test_a_run_measured_busier_than_its_baseline_is_unreliable_and_says_by_how_much():
    short, detail = unreliable_reason(ONE_EACH, load(0.1), load(1.5), "sdpa", "baseline")  # under BUSY_SHARE of 8
    assert short == "the machine was busier while sdpa measured"
    assert detail == "other processes used 1.50 of 8 cores while sdpa measured, 0.10 while baseline did"
    short, _ = unreliable_reason(ONE_EACH, load(1.5), load(0.1), "sdpa", "baseline")  # the baseline busier
    assert short == "the machine was busier while baseline measured"


def test_the_busy_machine_keeps_its_verdict_and_now_says_why():
    busy = Interval(1.30, 1.20, 1.41, method="one run each", busy=True)
    short, detail = unreliable_reason(busy, load(3.0), load(3.1), "sdpa", "baseline")
    assert short == "machine busy" and "3.10 of 8 cores while sdpa measured" in detail


def test_rounds_carry_the_load_in_their_interval():
    assert unreliable_reason(ROUNDS, load(0.1), load(1.5)) == ("", "")
    busy_rounds = Interval(1.30, 1.20, 1.41, rounds=3, method="paired rounds", busy=True)
    assert unreliable_reason(busy_rounds, load(3.0), load(3.0)) == ("", "")


def test_an_interval_too_wide_to_tell_the_size_is_unreliable_on_either_side_of_one():
    for wide in (Interval(1.5, 0.6, 3.0, method="one run each"), Interval(4.0, 2.5, 9.0, rounds=3)):
        short, detail = unreliable_reason(wide, load(0.1), load(0.1))
        assert short == "interval too wide"
        assert f"a factor of {wide.high / wide.low:.1f}, more than {WIDE_RATIO:g}" in detail
    assert unreliable_reason(Interval(1.0, 0.71, 1.41), None, None) == ("", "")  # just under the limit


def test_loads_not_known_say_nothing_about_busier():
    assert unreliable_reason(ONE_EACH, None, load(5.0)) == ("", "")
    assert unreliable_reason(ONE_EACH, load(None), load(5.0)) == ("", "")


def test_the_sentence_names_the_reason_the_figures_and_the_cure(monkeypatch):
    from scalekit.course import chapter
    from scalekit.training.results import RunResult

    base, other = RunResult(label="baseline", config={}), RunResult(label="sdpa", config={})
    base.load, other.load = load(0.1), load(1.5)
    monkeypatch.setattr(chapter, "speedup_over", lambda b, r: (ONE_EACH, ""))
    text = chapter.finding(other, base)
    assert text == ("sdpa against baseline: unreliable (the machine was busier while sdpa measured), 1.30× "
                    "(1.20–1.41× at 95%, one run each); other processes used 1.50 of 8 cores while sdpa measured, "
                    "0.10 while baseline did; measure again on a quiet machine, or in rounds (repeats=3)")
    assert chapter.finding_verdict(other, base) == "unreliable"
    monkeypatch.setattr(chapter, "speedup_over", lambda b, r: (Interval(3.0, 1.2, 7.5, rounds=3), ""))
    assert chapter.finding(other, base).endswith("measure more steps, or more rounds")
    base.load = other.load = load(0.1)
    monkeypatch.setattr(chapter, "speedup_over", lambda b, r: (ONE_EACH, ""))
    assert chapter.finding(other, base).startswith("sdpa is faster than baseline: 1.30×")
    assert chapter.finding_verdict(other, base) == "faster"
