"""The one statistics helper: a speed-up with its confidence interval, and the words for it.

Every comparison scalekit shows (the ladders, `compare()`, both Labs, autotune, the chapters) goes through
`speedup_interval`, and every sentence that says "faster", "slower" or "within noise" through `verdict`.

The method, and what it assumes:

- The unit is a run's **median** time per step (or per decode step): robust to the odd slow step.
  A speed-up is the ratio of two such medians, base ÷ candidate (above 1: the candidate is faster), worked
  out on the log scale, where a ratio is a difference and the interval is symmetric.
- **Paired rounds** (`repeats`, autotune): both configurations are measured once per round, the order
  alternating from round to round (AB, BA, AB, ...), so a machine that speeds up or slows down steadily
  hits both alike.  Each round gives one log ratio; the interval is Student's t over the rounds (k - 1
  degrees of freedom).  Assumed: rounds are independent and their log ratios roughly normal; drift slower
  than a round cancels in the pairing.
- **Within a run** the steps are not independent (a busy neighbour slows several in a row), so a run's own
  uncertainty comes from the method of batch means: its measured steps cut into up to 8 contiguous
  batches, the spread of the batches' log medians giving the variance of the run's log median.  This is a
  floor under the rounds' variance (two rounds that agree by chance never make an interval of zero
  width), and, with one run of each configuration, the whole interval (Welch's degrees of freedom).  One
  run each cannot see a change of the machine's speed between the two runs: such an interval says so
  (`method`), and repeats are the cure.
- **A busy machine** (the load meter, `measure/load.py`, saw other processes at work during a run): with one
  run each, the load may have moved between the two runs, which the interval cannot see, so the verdict is
  BUSY_VERDICT (the interval is still shown).  Paired rounds in alternating order spread the load over both
  sides and their interval carries it: the verdict stands, and the sentence says the machine was busy.
- **Alternating calls** (`training.profiling.call_finding`: A, B, A, B, ... one call at a time): each side is
  one run, its interval from the calls' own spread as for one run each, but the two were timed over the same
  stretch of time, so a load falls on both: a busy machine keeps the verdict, as paired rounds do, and the
  sentence says it was busy.  `measure/reliability.py` holds the rules that make a verdict unreliable.
- "Within noise" means the interval holds 1.0 (criterion.rs says "no change" for the same).  At the 95%
  level an A/A comparison (a configuration against itself) claims a difference in 5% of comparisons at
  most, when the assumptions hold: `tests/measure/test_stats.py` checks it with injected jitter, and
  `benchmarks/aa_noise.py` on the real machine.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

LEVEL = 0.95  # two-sided confidence level of every interval shown
MAX_BATCHES = 8  # contiguous batches a run's steps are cut into for its own variance
MIN_BATCH_STEPS = 3  # steps per batch at least: a median of 3 or more varies as the run's median does, per step
BUSY_VERDICT = "unreliable (machine busy)"  # one run each, measured while the load meter saw the machine busy
ONE_RUN_EACH = "one run each"  # Interval.method: each side measured once, one after the other
PAIRED_ROUNDS = "paired rounds"  # both sides measured once per round, the order alternating between rounds
ALTERNATING = "alternating calls"  # each side measured once, call for call in alternation (A, B, A, B, ...)


@dataclass(frozen=True)
class Interval:
    """A speed-up (base time ÷ candidate time: above 1 the candidate is faster) and its confidence interval."""

    estimate: float
    low: float
    high: float
    level: float = LEVEL
    rounds: int = 1  # paired rounds behind it (1: one run each)
    # PAIRED_ROUNDS, ONE_RUN_EACH (step-to-step noise only, not drift between runs) or ALTERNATING
    method: str = PAIRED_ROUNDS
    log_se: float = 0.0  # standard error of the log of the estimate (for combining intervals)
    df: float = math.inf  # its degrees of freedom
    busy: bool = False  # the load meter saw the machine busy while a run it rests on was measured

    @property
    def verdict(self) -> str:
        """'faster', 'slower', 'within noise' (the interval holds 1.0) or BUSY_VERDICT."""
        return verdict(self)

    def text(self) -> str:
        """'1.32× (1.21–1.44)'."""
        return f"{self.estimate:.2f}× ({self.low:.2f}–{self.high:.2f})"

    def scaled(self, factor: float) -> Interval:
        """The same interval for a ratio multiplied by `factor` (per-token normalisation)."""
        return Interval(self.estimate * factor, self.low * factor, self.high * factor, self.level, self.rounds,
                        self.method, self.log_se, self.df, self.busy)

    @property
    def unreliable(self) -> bool:
        """One run each on a busy machine: the load may have changed between the two runs, unseen."""
        return self.busy and self.method == ONE_RUN_EACH


def verdict(interval: Interval | None, threshold: float = 1.0) -> str:
    """'faster' when the whole interval is above `threshold`, 'slower' when it is below, else 'within noise';
    BUSY_VERDICT for one run each on a busy machine (paired rounds keep their verdict: the load is in them)."""
    if interval is None:
        return "not compared"
    if interval.unreliable:
        return BUSY_VERDICT
    if interval.low > threshold:
        return "faster"
    if interval.high < threshold:
        return "slower"
    return "within noise"


def sentence(subject: str, interval: Interval | None, other: str) -> str:
    """The finding in words, so a chapter's prose cannot contradict its table: 'LoRA is faster than full
    fine-tuning: 1.32× (1.21–1.44× at 95%)', '... slower than ...', '... within noise of ...', or, for one
    run each on a busy machine, '<subject> against <other>: unreliable (machine busy), ...'."""
    if interval is None:
        return f"{subject} and {other} were not compared"
    word, shown = interval.verdict, figures(interval)
    if word == BUSY_VERDICT:
        return (f"{subject} against {other}: {BUSY_VERDICT}, {shown}; measure again on a quiet machine, or in "
                f"rounds (repeats=3)")
    busy = f"; the machine was busy ({CARRIED.get(interval.method, 'its interval carries the load')})" \
        if interval.busy else ""
    if word == "within noise":
        return f"{subject} is within noise of {other}: {shown}, an interval that holds 1{busy}"
    return f"{subject} is {word} than {other}: {shown}{busy}"


# where a busy machine's load went, for the methods that keep their verdict on one
CARRIED = {PAIRED_ROUNDS: "the rounds' interval carries the load",
           ALTERNATING: "the calls alternated, so the load fell on both"}


def figures(interval: Interval) -> str:
    """'1.32× (1.21–1.44× at 95%, 3 rounds)', '... one run each)' or '... calls alternating)'."""
    how = {ONE_RUN_EACH: "one run each", ALTERNATING: "calls alternating"}.get(interval.method,
                                                                            f"{interval.rounds} rounds")
    return f"{interval.estimate:.2f}× ({interval.low:.2f}–{interval.high:.2f}× at {100 * interval.level:.0f}%, {how})"


# -- the interval ------------------------------------------------------------------------------------------
def speedup_interval(base_rounds: Sequence[Sequence[float]], rounds: Sequence[Sequence[float]],
                     level: float = LEVEL, statistic: Callable = statistics.median,
                     busy: bool = False, alternated: bool = False) -> Interval | None:
    """The speed-up of `rounds` over `base_rounds`: each a list of runs (one per round, paired by position),
    each run the times of its measured steps.  `statistic` makes a run's figure from its steps (the median;
    the mean where steps differ by design and the wall clock is the honest figure).  `busy`: the load meter
    saw the machine busy during any of the runs (it decides the verdict of one run each).  `alternated`: one run
    each whose steps were timed in alternation, call for call (method ALTERNATING).  None when there is nothing
    to compare."""
    pairs = [(a, b) for a, b in zip(base_rounds, rounds, strict=False) if len(a) and len(b)]
    if not pairs:
        return None
    logs = [math.log(statistic(a)) - math.log(statistic(b)) for a, b in pairs]
    within = [(run_log_variance(a, statistic), run_log_variance(b, statistic)) for a, b in pairs]
    if len(pairs) == 1:
        (va, vb), = within
        if va is None or vb is None:
            return None  # too few steps for a run's own variance: no honest interval from one run each
        method = ALTERNATING if alternated else ONE_RUN_EACH
        return _interval(logs[0], math.sqrt(va[0] + vb[0]), _welch_df(va, vb), level, 1, method, busy)
    k = len(logs)
    spread = statistics.variance(logs)
    floors = [va[0] + vb[0] for va, vb in within if va is not None and vb is not None]
    var = max(spread, statistics.fmean(floors) if floors else 0.0)
    return _interval(statistics.fmean(logs), math.sqrt(var / k), k - 1, level, k, PAIRED_ROUNDS, busy)


def _interval(log_ratio: float, se: float, df: float, level: float, rounds: int, method: str,
              busy: bool = False) -> Interval:
    half = t_quantile(0.5 + level / 2, df) * se
    return Interval(math.exp(log_ratio), math.exp(log_ratio - half), math.exp(log_ratio + half), level, rounds,
                    method, se, df, busy)


def product(intervals: Sequence[Interval], level: float = LEVEL) -> Interval | None:
    """The interval of a product of independently measured ratios (autotune's path: each kept change's
    speed-up over the best before it): log estimates add, their variances add, the fewest degrees of freedom."""
    if not intervals:
        return None
    se = math.sqrt(sum(iv.log_se ** 2 for iv in intervals))
    return _interval(sum(math.log(iv.estimate) for iv in intervals), se, min(iv.df for iv in intervals), level,
                     min(iv.rounds for iv in intervals), intervals[0].method, any(iv.busy for iv in intervals))


def too_few_steps(base_rounds: Sequence[Sequence[float]], rounds: Sequence[Sequence[float]]) -> str:
    """Why speedup_interval gave no interval for runs measured once each, or ''."""
    if len(base_rounds) > 1 and len(rounds) > 1:
        return ""
    fewest = min(len(r) for r in (*base_rounds[:1], *rounds[:1]))
    if fewest >= 2 * MIN_BATCH_STEPS:
        return ""
    return (f"no interval: {fewest} measured step(s) in one run each is too few to tell noise from a change "
            f"(measure {2 * MIN_BATCH_STEPS} or more, or in rounds: repeats=3)")


def run_samples(step_ms: list[float], per_s: float) -> tuple[float, ...]:
    """A run's step times as times per token, scaled so that their median is 1 / `per_s` (its tokens/s): the
    rounds compare runs whose batches may differ."""
    if not step_ms or not per_s:
        return ()
    median = statistics.median(step_ms)
    return tuple(ms / (median * per_s) for ms in step_ms)


def run_log_variance(samples: Sequence[float], statistic: Callable = statistics.median) -> tuple[float, int] | None:
    """(variance of the log of the run's figure, its degrees of freedom) by batch means, or None when the run
    has fewer than 2 × MIN_BATCH_STEPS steps."""
    batches = min(MAX_BATCHES, len(samples) // MIN_BATCH_STEPS)
    if batches < 2:
        return None
    edges = [round(i * len(samples) / batches) for i in range(batches + 1)]
    logs = [math.log(statistic(samples[edges[i]:edges[i + 1]])) for i in range(batches)]
    return statistics.variance(logs) / batches, batches - 1


def _welch_df(a: tuple[float, int], b: tuple[float, int]) -> float:
    """Welch–Satterthwaite degrees of freedom of a sum of two variance estimates."""
    (va, da), (vb, db) = a, b
    if va + vb == 0:
        return float(da + db)
    return (va + vb) ** 2 / (va ** 2 / da + vb ** 2 / db)


# -- Student's t, without scipy (the GPU image and a bare install lack it) ---------------------------------
def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom (bisection on the CDF)."""
    if not 0.5 <= p < 1:
        raise ValueError(f"t_quantile: p must be in [0.5, 1), got {p}")
    if df > 1e7:  # Student's t is the normal distribution there
        return statistics.NormalDist().inv_cdf(p)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if t_cdf(mid, df) < p else (low, mid)
    return (low + high) / 2


def t_cdf(t: float, df: float) -> float:
    """P(T ≤ t) for Student's t: 1 - I_x(df/2, 1/2)/2 with x = df / (df + t²), for t ≥ 0."""
    x = df / (df + t * t)
    tail = 0.5 * _incomplete_beta(df / 2, 0.5, x)
    return 1 - tail if t >= 0 else tail


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b) by its continued fraction (Numerical Recipes, 6.4)."""
    if x <= 0 or x >= 1:
        return 0.0 if x <= 0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(1 - x))
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(a, b, x) / a
    return 1 - front * _beta_fraction(b, a, 1 - x) / b


def _beta_fraction(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + num * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-14:
            break
    return h
