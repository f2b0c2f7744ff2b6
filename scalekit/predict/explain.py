"""Why plan_for ranks as it does, read off the predictions' step split: the terms a step's time is made of, the
one a runner-up loses most on against the winner, and the winner's lead in words."""

from __future__ import annotations

from .step import GIB, Prediction


def terms(pred: Prediction) -> dict[str, float]:
    """The step's terms in seconds, summing to its step time: the compute parts, each collective's exposed time,
    the bubble."""
    out = {f"compute ({k})": v for k, v in pred.compute_parts.items()}
    for c in pred.collectives:
        key = f"exposed {c.name}"
        out[key] = out.get(key, 0.0) + c.exposed_s
    out["pipeline bubble"] = pred.bubble_s
    return out


def _ms(s: float) -> str:
    return f"{s * 1e3:,.1f} ms"


def _against(term: str, mine: float, theirs: float) -> str:
    """'2.10× the winner's <term> (x ms against y ms)' or 'x ms of <term> where the winner has none'."""
    if theirs <= 0:
        return f"{_ms(mine)} of {term} where the winner has none"
    return f"{mine / theirs:.2f}× the winner's {term} ({_ms(mine)} against {_ms(theirs)})"


def lacks(runner: Prediction, winner: Prediction) -> tuple[str, str]:
    """(the term, a sentence): where `runner` loses most time against `winner`."""
    mine, best = terms(runner), terms(winner)
    diffs = {k: mine.get(k, 0.0) - best.get(k, 0.0) for k in set(mine) | set(best)}
    term = max(sorted(diffs), key=lambda k: diffs[k])
    if diffs[term] <= 0:
        return "", "predicted as fast as the winner (ranked below it by its memory)"
    share = runner.tokens_per_s_per_gpu / winner.tokens_per_s_per_gpu if winner.tokens_per_s_per_gpu else 0.0
    return term, (f"{share:.0%} of the winner's tokens/s per GPU (step {_ms(runner.step_s)} against "
                  f"{_ms(winner.step_s)}); it loses most on "
                  + _against(term, mine.get(term, 0.0), best.get(term, 0.0)))


def explain(ranked: list, budget: float) -> list[str]:
    """Why the winner wins (the term it gains most on, what it pays for it) and what each runner-up lacks;
    `ranked`: search.Ranked rows, best first (not imported: search imports this module)."""
    if not ranked:
        return []
    win = ranked[0]
    w = win.prediction
    mfu = f", MFU {100 * w.mfu:.1f}%" if w.mfu is not None else ""
    fit = f"fits in {w.memory['peak'] / GIB:.1f} of {budget / GIB:.1f} GiB per GPU"
    if len(ranked) == 1:
        return [f"the winner, {win.plan.label}: {w.tokens_per_s_per_gpu:,.0f} tokens/s per GPU{mfu}; the only plan "
                f"that fits ({fit})"]
    second = ranked[1].prediction
    mine, theirs = terms(w), terms(second)
    gains = {k: theirs.get(k, 0.0) - mine.get(k, 0.0) for k in set(mine) | set(theirs)}
    term = max(sorted(gains), key=lambda k: gains[k])
    lead = (w.tokens_per_s_per_gpu / second.tokens_per_s_per_gpu - 1) if second.tokens_per_s_per_gpu else 0.0
    if gains[term] <= 0:
        text = (f"the winner, {win.plan.label}: {w.tokens_per_s_per_gpu:,.0f} tokens/s per GPU{mfu}; it ties with "
                f"the runner-up, {ranked[1].plan.label}, and is ranked first by its smaller memory ({fit})")
    else:
        text = (f"the winner, {win.plan.label}: {w.tokens_per_s_per_gpu:,.0f} tokens/s per GPU{mfu}, "
                f"{lead:.{1 if lead >= 0.001 else 3}%} ahead of the runner-up, {ranked[1].plan.label}; it wins on {term}: "
                f"{_ms(mine.get(term, 0.0))} against the runner-up's {_ms(theirs.get(term, 0.0))}")
        cost_term = min(sorted(gains), key=lambda k: gains[k])
        if gains[cost_term] < 0:
            text += f", and pays {_ms(-gains[cost_term])} more of {cost_term} in return"
        text += f" ({fit})"
        if lead < 0.01:
            text += "; a lead under 1% is well inside the cost model's error: in practice the two tie"
    out = [text]
    for r in ranked[1:]:
        r.lacks = lacks(r.prediction, w)[1]
    out += [f"#{i} {r.plan.label}: {r.lacks}" for i, r in enumerate(ranked[1:10], 2)]
    return out

__all__ = ["terms", "lacks", "explain"]
