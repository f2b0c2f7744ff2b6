"""The statistics every comparison goes through, on scripted timings with injected jitter (no real clock), so
that what is asserted holds on any machine: an A/A comparison claims a difference at most as often as its
level says, a real 1.3× slowdown is found, and the words follow the interval."""

from __future__ import annotations

import math
import random

import pytest
import torch

import scalekit
from scalekit import RunConfig
from scalekit.measure import stats, timing
from scalekit.measure.stats import Interval, sentence, speedup_interval, t_quantile, verdict
from tests.helpers import scripted_generation, scripted_result


def scripted_run(rng: random.Random, steps: int, level_sd: float, step_sd: float, factor: float = 1.0) -> list[float]:
    """One run's step times on a busy machine: the whole run slower or faster (level_sd), each step on top."""
    level = rng.gauss(0, level_sd)
    return [10.0 * factor * math.exp(level + rng.gauss(0, step_sd)) for _ in range(steps)]


def claims(factor: float, comparisons: int, rounds: int, level_sd=0.03, step_sd=0.05, steps=10, seed=0) -> int:
    """How many of `comparisons` comparisons (each `rounds` paired rounds) claim a difference."""
    rng, found = random.Random(seed), 0
    for _ in range(comparisons):
        base = [scripted_run(rng, steps, level_sd, step_sd) for _ in range(rounds)]
        other = [scripted_run(rng, steps, level_sd, step_sd, factor) for _ in range(rounds)]
        found += speedup_interval(base, other).verdict != "within noise"
    return found


def test_students_t_quantiles_are_the_tabulated_ones():
    for df, value in ((1, 12.706), (2, 4.303), (5, 2.571), (10, 2.228), (30, 2.042), (1e9, 1.960)):
        assert t_quantile(0.975, df) == pytest.approx(value, abs=1e-3)


def test_an_aa_comparison_claims_a_difference_in_at_most_5_percent():
    # the same configuration against itself, 3 paired rounds, runs drifting by 3% and steps by 5%
    assert claims(1.0, 400, rounds=3) <= 0.05 * 400
    # one run each, on a machine whose speed does not drift between runs: the steps' own spread is the interval
    assert claims(1.0, 400, rounds=1, level_sd=0.0) <= 0.05 * 400


def test_a_real_slowdown_of_1_3x_is_found_in_at_least_95_percent():
    assert claims(1.3, 400, rounds=3) >= 0.95 * 400
    assert claims(1 / 1.3, 400, rounds=3) >= 0.95 * 400


def test_one_run_each_cannot_see_drift_between_runs_and_says_so():
    rng = random.Random(1)
    interval = speedup_interval([scripted_run(rng, 10, 0.0, 0.05)], [scripted_run(rng, 10, 0.0, 0.05)])
    assert interval.method == "one run each" and interval.rounds == 1
    assert "one run each" in sentence("B", interval, "A")
    assert speedup_interval([[10.0, 11.0]], [[9.0]]) is None  # too few steps for a run's own spread: no interval
    assert stats.too_few_steps([[10.0, 11.0]], [[9.0]]).startswith("no interval: 1 measured step(s)")


def test_rounds_that_agree_by_chance_still_carry_the_runs_own_noise():
    # two rounds with identical ratios: the interval is never of zero width while the runs have a spread
    rng = random.Random(2)
    a, b = scripted_run(rng, 12, 0.0, 0.05), scripted_run(rng, 12, 0.0, 0.05)
    interval = speedup_interval([a, a], [b, b])
    assert interval.low < interval.estimate < interval.high and interval.rounds == 2


def test_the_words_follow_the_interval():
    assert verdict(Interval(1.3, 1.2, 1.4)) == "faster" and verdict(Interval(0.7, 0.6, 0.8)) == "slower"
    assert verdict(Interval(1.05, 0.95, 1.15)) == "within noise" and verdict(None) == "not compared"
    assert sentence("LoRA", Interval(1.3, 1.2, 1.4, rounds=3), "full").startswith("LoRA is faster than full: 1.30×")
    assert sentence("LoRA", Interval(1.02, 0.9, 1.1, rounds=3), "full").startswith("LoRA is within noise of full")
    assert verdict(Interval(1.03, 1.01, 1.05), threshold=1.02) == "within noise"


def test_a_product_of_intervals_adds_their_logs_and_variances():
    rng = random.Random(3)
    a = speedup_interval([scripted_run(rng, 12, 0.02, 0.05) for _ in range(3)],
                         [scripted_run(rng, 12, 0.02, 0.05, 0.5) for _ in range(3)])
    both = stats.product([a, a])
    assert both.estimate == pytest.approx(a.estimate ** 2)
    assert both.log_se == pytest.approx(math.sqrt(2) * a.log_se) and both.low < both.estimate < both.high


class ScriptedClock:
    """Stands in for the step timer's clock: the model's forward advances it by the scripted step time, so a
    real run through scalekit's engine, results and tables measures exactly the injected timings."""

    def __init__(self, seed: int, level_sd: float = 0.03, step_sd: float = 0.05):
        self.now, self.rng, self.level_sd, self.step_sd, self.level = 0.0, random.Random(seed), level_sd, step_sd, 0.0

    def perf_counter(self) -> float:
        return self.now

    def config(self, factor: float, label: str) -> RunConfig:
        def build():  # each run is built afresh: its own level of the machine's speed
            self.level = self.rng.gauss(0, self.level_sd)
            return torch.nn.Linear(1, 1)

        def loss(model, batch):
            self.now += 0.010 * factor * math.exp(self.level + self.rng.gauss(0, self.step_sd))
            return model(batch).square().mean()

        return RunConfig(model=build, batch_fn=lambda b, d: torch.ones(b, 1, device=d), loss_fn=loss, batch_size=1,
                         device="cpu", steps=10, warmup_steps=1, log_every=10, measure_memory=False, label=label,
                         threads=1, check_memory=False)


@pytest.mark.parametrize("factor,expected", [(1.0, "within noise"), (1.3, "slower")])
def test_compare_with_repeats_through_the_engine_on_a_scripted_machine(monkeypatch, factor, expected):
    # 20 comparisons, each a baseline and a "toggle" (the same run, or one whose steps take 1.3× as long),
    # measured in 3 alternating rounds by scalekit.compare: at most 1 false claim, at least 19 slowdowns found
    import gc

    monkeypatch.setattr(gc, "collect", lambda *a: 0)  # each run's clean-up collection is the test's slowest part
    verdicts = []
    for seed in range(20):
        clock = ScriptedClock(seed)
        monkeypatch.setattr(timing, "time", clock)
        table = scalekit.compare([clock.config(1.0, "base"), clock.config(factor, "toggle")], repeats=3)
        verdicts.append(table.loc[1, "verdict"])
    assert sum(v == expected for v in verdicts) >= 19, verdicts
    assert all(v in ("within noise", "faster", "slower") for v in verdicts)


# -- a busy machine: one run each gets no verdict, paired rounds keep theirs ----------------------------------




def test_one_run_each_on_a_busy_machine_is_unreliable_and_rounds_are_not():
    one = Interval(1.54, 1.40, 1.70, method="one run each", busy=True)
    assert verdict(one) == stats.BUSY_VERDICT == "unreliable (machine busy)" and one.text() == "1.54× (1.40–1.70)"
    said = sentence("+ checkpointing", one, "baseline")
    assert said.startswith("+ checkpointing against baseline: unreliable (machine busy), 1.54× (1.40–1.70× at 95%")
    assert "faster" not in said and "slower" not in said  # the interval is shown, no direction is claimed
    assert verdict(one.scaled(0.5)) == stats.BUSY_VERDICT and verdict(stats.product([one])) == stats.BUSY_VERDICT
    rounds = Interval(0.16, 0.12, 0.20, rounds=5, method="paired rounds", busy=True)
    assert verdict(rounds) == "slower"  # alternating rounds carry the load in their interval
    assert sentence("bf16", rounds, "fp32") == ("bf16 is slower than fp32: 0.16× (0.12–0.20× at 95%, 5 rounds); the "
                                                "machine was busy (the rounds' interval carries the load)")
    assert verdict(Interval(1.54, 1.40, 1.70, method="one run each")) == "faster"  # a quiet machine: as before
    rng = random.Random(4)
    a, b = scripted_run(rng, 12, 0.0, 0.02), scripted_run(rng, 12, 0.0, 0.02, 0.5)
    assert speedup_interval([a], [b], busy=True).verdict == stats.BUSY_VERDICT
    assert speedup_interval([a, a], [b, b], busy=True).verdict == "faster"


def test_every_table_and_sentence_of_one_busy_run_each_says_unreliable():
    from scalekit.course.chapter import finding
    from scalekit.inference import compare_generations
    from scalekit.training.report import results_table
    from scalekit.training.results import compare

    base = scripted_result("baseline", [10.0, 10.2, 9.9, 10.1, 10.0, 10.3, 9.8, 10.1], busy=False)
    fast = scripted_result("+ toggle", [6.0, 6.1, 5.9, 6.2, 6.0, 6.1, 5.8, 6.0], busy=True)
    frame = compare([base, fast])
    assert frame.loc[1, "verdict"] == stats.BUSY_VERDICT and frame.loc[1, "speedup_low"] > 1  # the interval stays
    assert "the machine was busy" in frame.loc[1, "note"]
    assert stats.BUSY_VERDICT in results_table([base, fast])
    assert finding(fast, base).startswith(f"+ toggle against baseline: {stats.BUSY_VERDICT}, 1.6")
    assert compare([base, scripted_result("+ toggle", fast.timing_rounds()[0], busy=False)]).loc[1, "verdict"] == \
        "faster"
    plain = scripted_generation("plain", [10.0, 10.2, 9.9, 10.1, 10.0, 10.3, 9.8, 10.1], busy=True)
    cached = scripted_generation("cached", [2.0, 2.1, 1.9, 2.0, 2.2, 2.0, 1.9, 2.1], busy=False)
    assert compare_generations([plain, cached]).loc[1, "verdict"] == stats.BUSY_VERDICT  # the baseline's load counts
    assert stats.BUSY_VERDICT in finding(cached, plain)


def test_rows_measured_in_rounds_on_a_busy_machine_keep_their_verdict_beside_the_note():
    from scalekit.course.chapter import finding
    from scalekit.training.results import compare

    base = scripted_result("baseline", [10.0, 10.2, 9.9, 10.1, 10.0, 10.3, 9.8, 10.1], busy=False)
    fast = scripted_result("+ toggle", [6.0, 6.1, 5.9, 6.2, 6.0, 6.1, 5.8, 6.0], busy=True)
    for _ in range(2):  # two more rounds each, the later ones quiet: the busiest round's load is kept
        base.add_round(scripted_result("baseline", base.timing_rounds()[0], busy=False))
        fast.add_round(scripted_result("+ toggle", fast.timing_rounds()[0], busy=False))
    frame = compare([base, fast])
    assert frame.loc[1, "verdict"] == "faster" and "the machine was busy" in frame.loc[1, "note"]
    assert finding(fast, base).startswith("+ toggle is faster than baseline") and "the machine was busy" in \
        finding(fast, base)
