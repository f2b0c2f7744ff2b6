"""When a speed-up cannot be read as faster or slower, and the sentence that says so: the one rule behind the
chapters' `finding` (two results) and `training.profiling.call_finding` (two calls timed in alternation).

What makes a comparison unreliable depends on how it was measured (`Interval.method`):

- **one run each**: the machine busy during either run (the load meter's threshold: the verdict is
  BUSY_VERDICT), or other processes' load differing by more than BUSIER_CORES between the two runs.  The
  interval sees each run's step-to-step spread, never the machine slowing between the runs, so the ratio carries
  the difference.
- **paired rounds** (alternating order) and **alternating calls** (A, B, A, B, ...): both sides are timed over
  the same stretch of time, so a load falls on both and the interval carries it: a busy machine keeps the
  verdict, and the sentence says the machine was busy and names the load.
- **always**: an interval whose ends differ by more than WIDE_RATIO, whatever its side of 1, cannot say by how
  much.
"""

from __future__ import annotations

import math

from .load import MachineLoad
from .stats import ALTERNATING, BUSY_VERDICT, ONE_RUN_EACH, Interval, figures, sentence

BUSIER_CORES = 0.25  # one run each: other processes' load differing by more than this many cores between the runs
WIDE_RATIO = 2.0  # an interval whose ends differ by more than this factor says too little about the size

# what to do about an unreliable comparison, by how it was measured
CURES = {ONE_RUN_EACH: "measure again on a quiet machine, or in rounds (repeats=3)",
         ALTERNATING: "time more calls of each (a larger reps), on a quieter machine if it was busy"}
CURE_OF_ROUNDS = "measure more steps, or more rounds"


def unreliable_reason(interval: Interval | None, base_load: MachineLoad | None, load: MachineLoad | None,
                      subject: str = "the run", other: str = "the baseline") -> tuple[str, str]:
    """Why a comparison cannot be read as faster or slower, as (short reason, the figures behind it), or ('', '')
    when it can.  Pure: the interval (how it was measured) and the two sides' loads (measure/load.py) decide it,
    by the rules of the module's docstring.  Alternating calls pass the one load they were timed under twice."""
    if interval is None:
        return "", ""
    one_run_each = interval.method == ONE_RUN_EACH
    loads = load_words(base_load, load, subject, other, together=interval.method == ALTERNATING)
    if one_run_each and interval.unreliable:
        return "machine busy", loads or "the load meter saw other processes at work during one of the runs"
    if one_run_each and loads and abs(load.other_cpu_cores - base_load.other_cpu_cores) > BUSIER_CORES:
        busier = subject if load.other_cpu_cores > base_load.other_cpu_cores else other
        return f"the machine was busier while {busier} measured", loads
    width = interval.high / interval.low if interval.low > 0 else math.inf
    if width > WIDE_RATIO:
        varied = "calls" if interval.method == ALTERNATING else "steps"
        return "interval too wide", (f"its ends differ by a factor of {width:.1f}, more than {WIDE_RATIO:g}: the "
                                     f"{varied} varied too much to tell the size of a difference")
    return "", ""


def load_words(base_load: MachineLoad | None, load: MachineLoad | None, subject: str, other: str,
               together: bool = False) -> str:
    """'other processes used 1.50 of 8 cores while <subject> measured, 0.10 while <other> did' (`together`: one
    load over both sides, as alternating calls have: '... while <subject> and <other> were timed'), or '' when a
    load is not known."""
    cores = load.other_cpu_cores if load is not None else None
    base_cores = base_load.other_cpu_cores if base_load is not None else None
    if cores is None or base_cores is None:
        return ""
    if together:
        return f"other processes used {cores:.2f} of {load.cores} cores while {subject} and {other} were timed"
    return f"other processes used {cores:.2f} of {load.cores} cores while {subject} measured, {base_cores:.2f} " \
           f"while {other} did"


def judged_sentence(subject: str, interval: Interval | None, other: str, base_load: MachineLoad | None,
                    load: MachineLoad | None) -> str:
    """The comparison in the words its interval and the loads allow: `stats.sentence` ('<subject> is faster than
    <other>: 1.32× (1.21–1.44× at 95%, 3 rounds)', '... slower ...', '... within noise of ...'; where the machine
    was busy and the verdict stands, the load named after it), or '<subject> against <other>: unreliable (<why>),
    <figures>; <the numbers behind it>; <what to do>' where `unreliable_reason` gives a reason."""
    short, detail = unreliable_reason(interval, base_load, load, subject, other)
    together = interval is not None and interval.method == ALTERNATING
    busy_loads = load_words(base_load, load, subject, other, together) if interval is not None and interval.busy \
        else ""
    if not short:
        return sentence(subject, interval, other) + (f"; {busy_loads}" if busy_loads else "")
    word = BUSY_VERDICT if short == "machine busy" else f"unreliable ({short})"
    if busy_loads and busy_loads not in detail:
        detail += f"; the machine was busy: {busy_loads}"
    return f"{subject} against {other}: {word}, {figures(interval)}; {detail}; " \
           f"{CURES.get(interval.method, CURE_OF_ROUNDS)}"
