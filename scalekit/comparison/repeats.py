"""Repeats: the rows of a comparison measured again, round after round, the order alternating.

One run of each configuration cannot tell a faster toggle from a machine that got quieter between the two
runs.  With `repeats=k` every row that measured is run k times in all: the first round in the rows' own order
(the ladder's climb), the second in reverse, the third forward again (AB, BA, AB: asv's and our benchmarks'
interleaving), so drift in the machine's speed hits every row alike.  Each later round's steps are kept on
the row's result (`result.rounds`), and every speed-up then comes from the paired rounds
(scalekit.measure.stats).

The ladders call `repeat_rows`; `scalekit.compare(configs, repeats=3)` (scalekit/comparison/compare.py) measures
configurations this way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..errors import ConfigError

MAX_REPEATS = 100


def timing_only(cfg):
    """`cfg` for a later round, whose steps are all it is measured for: no memory probe (an extra, untimed
    step or generation) and, for a generation, no quality measures (after the timed tokens)."""
    fields = {"measure_memory": False}
    if hasattr(cfg, "quality"):
        fields["quality"] = False
    return dataclasses.replace(cfg, **fields)


def check_repeats(where: str, repeats) -> int:
    """`repeats` if it is a whole number from 1 to MAX_REPEATS, else a ConfigError naming `where` it was given."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or not 1 <= repeats <= MAX_REPEATS:
        raise ConfigError(f"{where} must be a whole number of rounds from 1 to {MAX_REPEATS}, got {repeats!r}")
    return repeats


def repeat_rows(results: list, measure_again: Callable[[int], object], repeats: int, stop=None,
                on_status=None) -> None:
    """Rounds 2..`repeats` of `results` (a ladder's or a comparison's rows): `measure_again(i)` measures row i
    once more; a row that did not measure in its first round is left as it is."""
    rows = [i for i, r in enumerate(results) if r.status == "ok" and r.finished]
    if len(rows) < 2:
        return
    for k in range(1, repeats):
        for i in rows[::-1] if k % 2 else rows:
            if stop is not None and stop.is_set():
                results[i].notes.append(f"repeats stopped before round {k + 1}")
                return
            if on_status:
                on_status(f"round {k + 1}/{repeats}: {results[i].label}")
            again = measure_again(i)
            if again.status == "ok" and again.finished:
                results[i].add_round(again)
            else:
                results[i].notes.append(f"round {k + 1} {again.status}: {again.error or 'not measured'}")
