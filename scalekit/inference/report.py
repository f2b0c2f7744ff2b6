"""Plain-text tables of generations for terminals: speed beside weight and cache bytes and quality."""

from __future__ import annotations

from ..measure.text_tables import interval_cells, measurement_footer, text_table
from .results import GenerateResult, generation_speedup


def _fmt(value, spec: str, missing: str = "—") -> str:
    return missing if value is None else format(value, spec)


def _mb(n) -> str:
    return "—" if n is None else f"{n / 2**20:.2f}"


HEADER = ["run", "decode tok/s", "speed-up", "95% interval", "vs baseline", "ms/token", "p25–p75 ms", "p90 ms",
          "TTFT ms", "weights MB", "KV MB", "peak MB", "perplexity", "agree", "note"]


def _said(status: str, words: str) -> str:
    """The status, then why, said once ("stopped: stopped during the warm-up" reads twice)."""
    if not words:
        return status
    return words if words.startswith(status) else f"{status}: {words}"


def generation_table(results: list[GenerateResult]) -> str:
    """One line per generation: decode tokens/s and its speed-up over the first row with its 95% interval and
    what it says (faster, slower, within noise), per-token latency with its spread, time to first token,
    weight / KV-cache / peak MB, perplexity and greedy agreement."""
    base = next((r for r in results if r.finished and r.decode_tokens_per_s), None)
    rows = [_row(r, base) for r in results]
    out = text_table(HEADER, rows)
    said = base or next((r for r in results if r.finished), None)  # a one-token generation has no decode rate
    if said:
        out.append(f"device: {said.device}; torch {said.torch_version}; batch {said.batch_size}, "
                   f"{said.new_tokens} new tokens; decode tok/s = batch ÷ the median decode step; "
                   f"memory: {said.mem_source or 'not probed'}")
    return "\n".join(out + measurement_footer([r for r in results if r.token_ms]))


def _row(r: GenerateResult, base: GenerateResult | None) -> list[str]:
    if not r.finished:
        return [r.label] + ["—"] * (len(HEADER) - 2) + [_said(r.status, r.error or "; ".join(r.notes))]
    interval, why = generation_speedup(base, r) if base and r is not base else (None, "")
    notes = [why] if why else []
    notes += [f"compile {r.compile_s:.1f} s" if r.compile_s is not None else ""]
    notes += [n for n in r.notes if not n.startswith("quantize=")]
    if r.status == "stopped" and not any(n.startswith("stopped") for n in notes):
        notes.insert(1, "stopped")
    if r.weight_bytes_before and r.weight_bytes != r.weight_bytes_before:
        notes.append(f"weights {_mb(r.weight_bytes_before)} → {_mb(r.weight_bytes)} MB")
    if r.accepted_counts:  # speculative decoding: how often the draft was right
        kept = "—" if r.acceptance_rate is None else f"{r.acceptance_rate:.0%}"
        notes.append(f"draft tokens kept {kept} (verifications keeping 0..k: {r.accepted_counts}), "
                     f"{r.target_forwards_per_token:.2f} forwards of the model per token")
    notes += ["machine busy"] if r.busy_note else []
    if r.flags:  # an "ok" row that is not what its label says (compile on, no graph: eager code measured)
        notes.insert(0, ", ".join(flag.upper() for flag in r.flags))
    d = r.all_decode_ms
    spread = f"{d.p25:.2f}–{d.p75:.2f}" if d and d.n else "—"
    return [r.label, _fmt(r.decode_tokens_per_s, ",.0f"), *interval_cells(interval, r is base, why),
            _fmt(r.typical_decode_ms, ".2f"), spread, _fmt(r.decode_ms_p90, ".2f"), _fmt(r.ttft_ms, ".1f"),
            _mb(r.weight_bytes), _mb(r.kv_cache_bytes), _mb(r.peak_mem_bytes), _fmt(r.perplexity, ".3f"),
            _fmt(r.agreement, ".1%"), "; ".join(n for n in notes if n)]
