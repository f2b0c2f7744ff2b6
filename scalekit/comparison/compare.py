"""`scalekit.compare`: the side-by-side table of results, or of configurations measured in alternating rounds.

    scalekit.compare([base, fast])                                  # results already measured
    scalekit.compare([RunConfig(preset="tiny"), RunConfig(preset="tiny", toggles=["bf16"])], repeats=3)
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import ConfigError
from ..inference import GenerateConfig, GenerateResult, compare_generations, generate
from ..training.engine import run
from ..training.results import compare as compare_runs
from .repeats import check_repeats, repeat_rows, timing_only


def measure_rounds(configs: Sequence, repeats: int = 3, stop=None, on_status=None) -> list:
    """Each RunConfig (or GenerateConfig) measured `repeats` times, the order alternating round by round; the
    results, one per config, carry their rounds."""
    check_repeats("compare(repeats=)", repeats)

    def measure(cfg):
        how = generate if isinstance(cfg, GenerateConfig) else run
        return how(cfg, stop=stop, on_status=on_status, catch_errors=True)

    results = [measure(cfg) for cfg in configs]
    repeat_rows(results, lambda i: measure(timing_only(configs[i])), repeats, stop=stop, on_status=on_status)
    return results


def compare(items: Sequence, repeats: int = 1):
    """The side-by-side table of `items`: results as measured, or configurations, measured here (`repeats`
    times each, in alternating order).  Training rows: scalekit.training.results.compare; generations:
    scalekit.compare_generations.  Speed-ups are per token, against the first row that measured, with their
    95% interval and verdict (faster, slower, within noise)."""
    items = list(items)
    check_repeats("compare(repeats=)", repeats)
    configs = [i for i, item in enumerate(items) if not hasattr(item, "timing_rounds")]
    if not configs and repeats > 1:
        raise ConfigError("compare: repeats= measures configurations again; these are results already measured "
                          "(pass the RunConfigs or GenerateConfigs to have them measured in rounds)")
    for i, result in zip(configs, measure_rounds([items[i] for i in configs], repeats), strict=True):
        items[i] = result
    generations = [isinstance(r, GenerateResult) for r in items]
    if any(generations) and not all(generations):
        raise ConfigError("compare: training runs and generations measure different things: compare them apart")
    return compare_generations(items) if items and all(generations) else compare_runs(items)
