"""Autotune for generation: the fastest decode for a GenerateConfig on this machine, quality kept.

The same greedy, paired search as training (`autotune.search`), over the inference toggles: inference_mode,
the KV cache (dynamic, then static), SDPA, bf16, compile, then weight quantization (the first int8 and the
first 4-bit method that run here, as the inference ladder picks them), the int8 KV cache, and speculative
decoding (draft model, prompt lookup), whose floor is equality: any greedy token that differs refuses it.  Speed is decode tokens/s; one-off
costs (compiling the decode step) are weighed against `run_tokens`, the tokens the real workload generates.
A change that makes the output worse than `min_agreement` (the share of held-out positions whose greedy
token equals the unmodified model's) is refused, however fast: quantization and bf16 are judged on quality
before speed.  As in training, the search starts from no toggle on, the configuration's own toggles a candidate
(see autotune.search), and its winner is checked against every configuration it measured.  No planner prunes
generation candidates (scalekit's planner is for training steps); a measured peak over `budget_bytes` is refused
as in training.
"""

from __future__ import annotations

import dataclasses

from ..comparison.repeats import timing_only
from ..errors import ConfigError
from ..inference import GenerateConfig, generate
from ..machine.hardware import detect
from ..measure.stats import run_samples
from ..toggles import TOGGLES
from .budget import Deadline
from .changes import declared_changes
from .result import TuneResult, check_arguments, config_conflicts
from .search import search
from .space import Measurement, SearchSpace, config_key

MIN_AGREEMENT = 0.95  # default quality floor: greedy tokens equal to the unmodified model's at ≥95% of positions

def generation_space(base: GenerateConfig, hw, min_agreement: float, stop=None) -> SearchSpace:
    family = base.family() if base.custom_model else None  # what the model's family takes (Hugging Face, yours)

    def choice_available(name: str, value) -> tuple[bool, str]:
        toggle = TOGGLES[name]
        if family is not None:
            ok, why = toggle.choice_applies(family, value)
            if not ok:
                return False, f"{name} {why}"
        return toggle.choice_available(hw, value)

    judged: dict = {}  # configuration -> (why refused, peak bytes) from its first measurement

    def measure(cfg: GenerateConfig) -> Measurement:
        again = judged.get(config_key(cfg))  # quality and memory do not change between rounds: timed only
        r = generate(timing_only(cfg) if again else cfg, stop=stop, hw=hw, catch_errors=True)
        if r.status not in ("ok", "stopped") or not r.decode_tokens_per_s:
            return Measurement(0.0, None, failed=r.error or r.status)
        refused, peak = again or (_refusal(r, min_agreement, _exact(cfg)), r.peak_mem_bytes)
        if r.status == "ok":
            judged[config_key(cfg)] = (refused, peak)
        step_ms = r.decode_ms.median if r.decode_ms else None
        return Measurement(r.decode_tokens_per_s, peak, r.compile_s or 0.0, step_ms, refused=refused,
                           samples=run_samples(r.token_ms, r.decode_tokens_per_s), note=r.compile_note)

    applies = None if family is None else (lambda t: t.applies_to(family)[0])
    declared = declared_changes("generate", hw, applies)
    return SearchSpace(changes=[(label, toggles) for label, toggles, _ in declared],
                       available=lambda name: TOGGLES[name].available(hw), conflicts=config_conflicts(base),
                       planned_peak=lambda cfg: None, measure=measure, choice_available=choice_available,
                       uninterruptible=frozenset(label for label, _, tune in declared if tune.uninterruptible))


def _exact(cfg: GenerateConfig) -> bool:
    """Whether a toggle of `cfg` promises the greedy tokens of plain decoding (Tune.exact): any change refuses it."""
    return cfg.temperature == 0 and any(tune.exact for name in cfg.toggles for tune in TOGGLES[name].tuning)


def _refusal(r, min_agreement: float, exact: bool = False) -> str | None:
    """Why a generation's output is not acceptable (quality below the floor, or a token changed that must not
    change), or None."""
    if exact and r.same_as_plain_tokens is not None and r.same_as_plain_tokens < r.new_tokens:
        return (f"quality: greedy tokens must equal those of the same model decoded one token per forward, and "
                f"they differ from token {r.same_as_plain_tokens + 1} of {r.new_tokens}")
    if r.agreement is None or r.agreement >= min_agreement:
        return None
    return (f"quality: the greedy token matches the unmodified model's at {r.agreement:.1%} of held-out positions, "
            f"below min_agreement={min_agreement:.0%} (perplexity {r.perplexity:.3f} against "
            f"{r.reference_perplexity:.3f})")


def autotune_generation(config: GenerateConfig, budget_bytes: int | None = None, time_budget_s: float = 300.0,
                        run_tokens: int = 10_000, min_agreement: float = MIN_AGREEMENT, max_new_tokens: int = 64,
                        stop=None, on_candidate=None, hw=None, on_note=None, start: str = "baseline"):
    """The fastest generation configuration found for `config` (see the module docstring).  Each candidate
    generates `max_new_tokens` per measurement; the configuration returned keeps `config`'s own length.  `start`:
    as autotune's (from no toggle on, `config`'s toggles a candidate; or "given": from `config` as it is)."""
    check_arguments(budget_bytes, time_budget_s, run_tokens, max_new_tokens, start)
    if isinstance(min_agreement, bool) or not isinstance(min_agreement, (int, float)) or not 0 <= min_agreement <= 1:
        raise ConfigError(f"autotune: min_agreement must be a share from 0 to 1, got {min_agreement!r}")
    hw = hw or detect(config.device, "GenerateConfig")
    stop = Deadline(time_budget_s, stop)  # a measurement under way ends before the budget runs out
    # quality is what guards the quantized and bf16 candidates: measured on every run
    fits = dataclasses.replace(config, max_new_tokens=None).max_new_tokens  # what the model's context leaves
    base = dataclasses.replace(config, max_new_tokens=min(max_new_tokens, fits), quality=True, label=None)
    found = search(base.resolve(hw), generation_space(base, hw, min_agreement, stop), budget_bytes=budget_bytes,
                   time_budget_s=time_budget_s, run_steps=run_tokens, stop=stop, on_candidate=on_candidate,
                   on_note=on_note, from_baseline=start == "baseline")
    best = dataclasses.replace(found.best, max_new_tokens=config.max_new_tokens, quality=config.quality, label=None)
    return TuneResult(best=best, search=found, budget_bytes=budget_bytes, run_steps=run_tokens)
