"""What autotune returns: the configuration chosen, with the whole search kept for tables, plots and export."""

from __future__ import annotations

import dataclasses

from ..checks import micro_batch_rows
from ..errors import ConfigError
from ..measure.stats import Interval, sentence, verdict
from ..toggles import plan_facts
from ..training.config import RunConfig
from .crown import _ratio, _standing
from .paired import MIN_GAIN, _over_budget
from .space import Candidate, Search


@dataclasses.dataclass
class TuneResult:
    """What autotune found, with the whole search kept for the table and the plots."""

    best: RunConfig
    search: Search
    budget_bytes: int | None
    run_steps: int

    @property
    def path(self) -> list[Candidate]:
        return self.search.path

    @property
    def rejected(self) -> list[Candidate]:
        return self.search.rejected

    def table(self):
        """One row per candidate: kept or not, why, its speed-up over the best at the time with the interval
        and rounds behind it, its tokens/s beside the best's in the same rounds, peak memory, compile time."""
        import pandas as pd

        rows = [{"change": c.label, "kept": c.accepted, "speedup vs best then": c.speedup,
                 "interval": f"{c.interval.low:.3f}–{c.interval.high:.3f}" if c.interval else None,
                 "rounds": c.rounds or None, "tokens_per_s": c.tokens_per_s,
                 "best tokens_per_s (same rounds)": c.best_tokens_per_s,
                 "peak_mem_mb": c.peak_bytes / 2**20 if c.peak_bytes is not None else None,
                 "compile_s": c.compile_s, "why": c.reason} for c in self.search.candidates]
        return pd.DataFrame(rows)

    def to_dict(self) -> dict:
        s = self.search
        vs_start = s.speedup_vs_start
        return {"best": self.best.to_dict(), "baseline": s.baseline.to_dict() if s.baseline is not None else None,
                "best_tokens_per_s": s.best_tokens_per_s,
                "speedup_vs_start": dataclasses.asdict(vs_start) if vs_start else None,
                "best_peak_bytes": s.best_peak_bytes, "budget_bytes": self.budget_bytes, "run_steps": self.run_steps,
                "elapsed_s": s.elapsed_s, "stopped": s.stopped, "notes": s.notes,
                "candidates": [dataclasses.asdict(c) for c in s.candidates]}

    def export(self, target: str = "hf", world_size: int = 1) -> str:
        """Python source that trains with the configuration chosen, in Transformers ('hf': its TrainingArguments),
        Accelerate ('accelerate') or Lightning ('lightning'); what a framework has no setting for is said in
        comments.  world_size: processes, when the winner spreads over several (ddp, fsdp)."""
        from ..hf.export import export_code

        if not isinstance(self.best, RunConfig):
            raise ConfigError("export writes training code (TrainingArguments, Accelerate, Lightning); a generation "
                              "configuration has no such settings: use result.best with scalekit.generate")
        return export_code(self.best, target, world_size=world_size)

    def summary(self) -> str:
        """What was chosen and what supports it: its speed-up over the baseline (the paired speed-ups that chain it
        to the baseline multiplied, with the interval), and its tokens/s as measured beside the last candidate."""
        s = self.search
        kept = ", ".join(c.label for c in s.path) or "nothing: the baseline is the fastest found"
        kept += "".join(f"; {c.label}" for c in s.crowned[-1:])
        vs = s.speedup_vs_start
        gain = f"{vs.estimate:.2f}× the baseline's speed ({vs.low:.2f}–{vs.high:.2f}× at {100 * vs.level:.0f}%)" \
            if vs else "the baseline"
        speed = f"; {s.best_tokens_per_s:,.0f} tokens/s when last measured" if s.best_tokens_per_s else ""
        stop = f"; stopped early: {s.stopped}" if s.stopped else ""
        return (f"chose {self.best.describe()}: {gain}{speed}; after {len(s.candidates)} candidates in "
                f"{s.elapsed_s:.0f} s; kept: {kept}{stop}")

    def against_measured(self) -> list[tuple[str, Interval | None, str]]:
        """The final check, as it stands: every other configuration measured that fits the budget, as (its label,
        its speed-up over the winner through the paired rounds that link them, the verdict at 1 + MIN_GAIN).  After
        a search none says 'faster': one that did would have been crowned."""
        winner = _standing(self.search)
        if winner is None:
            return []
        out = []
        for s in self.search.standings:
            if s is winner or _over_budget(s.peak_bytes, self.budget_bytes):
                continue
            iv = _ratio(s, winner)
            out.append((s.label, iv, verdict(iv, 1 + MIN_GAIN) if iv else "the same rounds"))
        return out

    def finding(self) -> str:
        """The winner against the baseline in the words its interval allows (scalekit.measure.stats.sentence):
        'the winner (bf16 + sdpa) is faster than the baseline: 1.32× (1.21–1.44× at 95%, 3 rounds)'."""
        s = self.search
        if not s.steps:
            return "the winner is the baseline itself: no change was faster beyond noise"
        return sentence(f"the winner ({self.best.describe()})", s.speedup_vs_start, "the baseline")


STARTS = ("baseline", "given")  # where a search starts: no toggle on (the given toggles a candidate), or as given


def check_arguments(budget_bytes, time_budget_s, run_steps, steps, start: str = "baseline") -> None:
    if start not in STARTS:
        raise ConfigError(f"autotune: start must be one of {', '.join(map(repr, STARTS))}, got {start!r}")
    for name, value, integer in (("budget_bytes", budget_bytes, True), ("time_budget_s", time_budget_s, False),
                                 ("run_steps", run_steps, True), ("steps", steps, True)):
        if value is None and name == "budget_bytes":
            continue
        bad = isinstance(value, bool) or not isinstance(value, (int,) if integer else (int, float)) or not value > 0
        if bad:
            raise ConfigError(f"autotune: {name} must be a positive {'whole number' if integer else 'number'}, "
                              f"got {value!r}")


def config_conflicts(base):
    """SearchSpace.conflicts for configurations like `base`: why a set of toggles cannot go together, in the
    config's own words (its validation), or None."""

    def conflicts(toggles: dict) -> str | None:
        try:
            cfg = dataclasses.replace(base, toggles=toggles)
        except ConfigError as exc:
            return str(exc).split(": ", 1)[-1]
        if hasattr(cfg, "batch_size"):  # micro-batches that do not split the batch: refused before the planner is
            try:  # asked (it refuses them too, with an error the search does not expect)
                micro_batch_rows(cfg.batch_size, 1, plan_facts(cfg.toggles).micro_batches)
            except ConfigError as exc:
                return str(exc)
        return None

    return conflicts
