"""Plain-text tables of generations for terminals: speed beside weight and cache bytes and quality."""

from __future__ import annotations

from .results import GenerateResult


def _fmt(value, spec: str, missing: str = "—") -> str:
    return missing if value is None else format(value, spec)


def _mb(n) -> str:
    return "—" if n is None else f"{n / 2**20:.2f}"


def _said(status: str, words: str) -> str:
    """The status, then why, said once ("stopped: stopped during the warm-up" reads twice)."""
    if not words:
        return status
    return words if words.startswith(status) else f"{status}: {words}"


def generation_table(results: list[GenerateResult]) -> str:
    """One line per generation: decode tokens/s and its speed-up over the first row, per-token latency,
    time to first token, weight / KV-cache / peak MB, perplexity and greedy agreement."""
    base = next((r for r in results if r.finished and r.decode_tokens_per_s), None)
    header = ["run", "decode tok/s", "speed-up", "ms/token", "p90 ms", "TTFT ms", "weights MB", "KV MB", "peak MB",
              "perplexity", "agree", "note"]
    rows = []
    for r in results:
        if not r.finished:
            rows.append([r.label] + ["—"] * 10 + [_said(r.status, r.error or "; ".join(r.notes))])
            continue
        speedup = r.decode_tokens_per_s / base.decode_tokens_per_s if base and r.decode_tokens_per_s else None
        notes = [f"compile {r.compile_s:.1f} s" if r.compile_s is not None else ""]
        notes += [n for n in r.notes if not n.startswith("quantize=")]
        if r.status == "stopped" and not any(n.startswith("stopped") for n in notes):
            notes.insert(1, "stopped")
        if r.weight_bytes_before and r.weight_bytes != r.weight_bytes_before:
            notes.append(f"weights {_mb(r.weight_bytes_before)} → {_mb(r.weight_bytes)} MB")
        rows.append([r.label, _fmt(r.decode_tokens_per_s, ",.0f"), _fmt(speedup, ".2f") + ("×" if speedup else ""),
                     _fmt(r.decode_ms.median if r.decode_ms and r.decode_ms.n else None, ".2f"),
                     _fmt(r.decode_ms_p90, ".2f"),
                     _fmt(r.ttft_ms, ".1f"), _mb(r.weight_bytes), _mb(r.kv_cache_bytes), _mb(r.peak_mem_bytes),
                     _fmt(r.perplexity, ".3f"), _fmt(r.agreement, ".1%"), "; ".join(n for n in notes if n)])
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    numeric = set(range(1, 11))

    def line(cells) -> str:
        return "  ".join(str(c).rjust(w) if i in numeric else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    out = [line(header), line("-" * w for w in widths), *(line(r) for r in rows)]
    said = base or next((r for r in results if r.finished), None)  # a one-token generation has no decode rate
    if said:
        out.append(f"device: {said.device}; torch {said.torch_version}; batch {said.batch_size}, "
                   f"{said.new_tokens} new tokens; decode tok/s = batch ÷ the median decode step; "
                   f"memory: {said.mem_source or 'not probed'}")
    return "\n".join(out)
