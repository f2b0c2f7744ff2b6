"""`scalekit.autotune`: find the fastest configuration for this model on this machine, within a memory budget.

    result = scalekit.autotune(RunConfig(preset="small"), budget_bytes=2**30, time_budget_s=120, run_steps=5000)
    result.best            # the RunConfig chosen
    result.table()         # the path (each accepted change, its speed-up and memory) and every rejection, why
    result.export("hf")    # the winner as TrainingArguments code (also "accelerate", "lightning")

The search itself (`autotune.search` and the modules it draws on) is measurement-agnostic; this module gives it
the real machine: the toggles' own availability and exclusions, the planner for pruning, and `scalekit.run` for
measuring.
"""

from __future__ import annotations

import dataclasses

from ..comparison.repeats import timing_only
from ..errors import ConfigError, PlanUnavailable
from ..hf.family_of import toggle_family
from ..machine.hardware import detect
from ..measure.stats import run_samples
from ..plan import estimate
from ..toggles import TOGGLES
from ..training.config import RunConfig
from ..training.engine import run
from .budget import Deadline
from .changes import declared_changes
from .paired import MAX_ROUNDS, MIN_GAIN, MIN_ROUNDS
from .result import TuneResult, check_arguments, config_conflicts
from .search import search
from .space import Candidate, Measurement, SearchSpace, config_key

__all__ = ["autotune", "TuneResult", "Candidate", "Measurement", "SearchSpace", "search", "declared_changes",
           "MIN_GAIN", "MIN_ROUNDS", "MAX_ROUNDS", "run_samples"]

def autotune(config: RunConfig, budget_bytes: int | None = None, time_budget_s: float = 300.0,
             run_steps: int = 1000, steps: int = 8, warmup_steps: int = 2, stop=None, on_candidate=None,
             hw=None, on_note=None, start: str = "baseline") -> TuneResult:
    """The fastest configuration found for `config`'s model on this machine whose measured peak fits
    `budget_bytes` (None: no budget), searching at most `time_budget_s` seconds.  A GenerateConfig is tuned for
    generation instead (autotune.generation: decode tokens/s, quality kept; run_steps is then the tokens the
    real workload generates).  `run_steps` is the length
    of the real run planned: one-off costs (compile time) must pay for themselves over it.  Each candidate
    is measured for `steps` steps after `warmup_steps`, against the best so far in paired rounds.
    `on_note(text)` hears what the search says before it starts.  `start="baseline"` (the default) searches
    from `config` with no toggle on, trying its toggles as one candidate and, if they are kept, each switched off
    again once the rest is settled; `start="given"` searches from `config` as it is (its toggles can still be
    switched off)."""
    from ..inference import GenerateConfig

    if isinstance(config, GenerateConfig):  # generation: the inference toggles, decode tokens/s, quality kept
        from .generation import autotune_generation

        return autotune_generation(config, budget_bytes=budget_bytes, time_budget_s=time_budget_s,
                                   run_tokens=run_steps, stop=stop, on_candidate=on_candidate, hw=hw, on_note=on_note,
                                   start=start)
    if not isinstance(config, RunConfig):
        raise ConfigError(f"autotune takes a RunConfig (training) or a GenerateConfig (generation), got "
                          f"{type(config).__name__}")
    check_arguments(budget_bytes, time_budget_s, run_steps, steps, start)
    hw = hw or detect(config.device)
    stop = Deadline(time_budget_s, stop)  # a measurement under way ends before the budget runs out
    base = dataclasses.replace(config, steps=steps, warmup_steps=warmup_steps, label=None)
    space = machine_space(base, hw, stop)
    found = search(base.resolve(hw), space, budget_bytes=budget_bytes, time_budget_s=time_budget_s,
                   run_steps=run_steps, stop=stop, on_candidate=on_candidate, on_note=on_note,
                   from_baseline=start == "baseline")
    best = dataclasses.replace(found.best, steps=config.steps, warmup_steps=config.warmup_steps, label=None)
    return TuneResult(best=best, search=found, budget_bytes=budget_bytes, run_steps=run_steps)


def machine_space(base: RunConfig, hw, stop=None) -> SearchSpace:
    """The search space on this machine: the changes that exist and apply, the toggles' own rules, the planner,
    and scalekit.run."""
    adapter = toggle_family(base.model) if base.custom_model else None  # what the model's family can change
    declared = declared_changes("train", hw, applies=lambda t: not base.custom_model or t.applies_to(adapter)[0])
    changes = [(label, toggles) for label, toggles, _ in declared]

    resolved = base.resolve(hw)

    def available(name: str) -> tuple[bool, str]:
        ok, why = TOGGLES[name].available(hw)
        nothing = TOGGLES[name].changes_nothing(resolved) if ok else None
        return (False, nothing) if nothing else (ok, why)

    def planned_peak(cfg: RunConfig) -> int | None:
        try:
            return estimate(cfg, device=hw.device_type).peak_bytes
        except PlanUnavailable:
            return None

    peaks: dict = {}  # configuration -> its peak bytes, from its first measurement

    def measure(cfg: RunConfig) -> Measurement:
        key = config_key(cfg)
        r = run(timing_only(cfg) if key in peaks else cfg, stop=stop, hw=hw, catch_errors=True)
        if r.status not in ("ok", "stopped") or not r.tokens_per_s:
            return Measurement(0.0, None, failed=r.error or r.status)
        if r.status == "ok" and key not in peaks:  # the memory probe (an extra step on a CPU) once is enough
            peaks[key] = r.peak_mem_bytes
        return Measurement(r.tokens_per_s, peaks.get(key, r.peak_mem_bytes), r.compile_s or 0.0, r.median_step_ms,
                           samples=run_samples(r.timing_rounds()[0], r.tokens_per_s), note=r.compile_note)

    return SearchSpace(changes=changes, available=available, conflicts=config_conflicts(base),
                       planned_peak=planned_peak,
                       measure=measure, batch_sizes=lambda cfg, budget: _larger_batches(cfg, budget, planned_peak),
                       memory_only=frozenset(label for label, _, tune in declared if tune.memory_only),
                       uninterruptible=frozenset(label for label, _, tune in declared if tune.uninterruptible))



def _larger_batches(cfg: RunConfig, budget_bytes, planned_peak) -> list[int]:
    """Twice and four times the batch, where the planner says they fit the budget (a budget is needed:
    without one a larger batch always 'fits' until the machine runs out)."""
    if budget_bytes is None:
        return []
    out = []
    for factor in (2, 4):
        bigger = dataclasses.replace(cfg, batch_size=cfg.batch_size * factor)
        planned = planned_peak(bigger)
        if planned is not None and planned <= budget_bytes:
            out.append(bigger.batch_size)
    return out
