"""Nice numbers: pad the vocabulary to a multiple of 64 and check batch and sequence sizes against 8."""

from __future__ import annotations

from .base import BuildContext, Spelling, Toggle, Tune

VOCAB_MULTIPLE = 64
SHAPE_MULTIPLE = 8


class NiceNumbers(Toggle):
    name = "nice_numbers"
    summary = "vocab padded to a multiple of 64 (50257 → 50304); batch and sequence checked against 8"
    cost = "a few unused embedding rows (their logits are masked to -inf)"
    helps_when = "matmul dimensions are odd: kernels work in tiles, and ragged edges waste a whole tile"
    group = "shapes"
    phase = "model_config"
    tuning = (Tune(rank=50),)
    gpt_only = True  # the built-in GPT's vocabulary, or a model family's (Hugging Face: resize_token_embeddings)

    def applies_to(self, adapter) -> tuple[bool, str]:
        return adapter.vocab_padding_support()

    def apply(self, ctx: BuildContext, value) -> None:
        cfg = ctx.gpt_config
        if cfg is not None:
            cfg.padded_vocab_size = round_up(cfg.vocab_size, VOCAB_MULTIPLE)
            if cfg.padded_vocab_size != cfg.vocab_size:
                ctx.notes.append(f"vocab padded {cfg.vocab_size} → {cfg.padded_vocab_size}")
        else:  # Hugging Face: resize_token_embeddings(..., pad_to_multiple_of=64) once the model is built
            ctx.model_adapter.pad_vocab(VOCAB_MULTIPLE)
            ctx.notes.append(f"vocab padded to a multiple of {VOCAB_MULTIPLE} by the model's own resize (the padded "
                             f"rows' logits are not masked, as in Transformers)")
        for field in ("batch_size", "seq_len"):
            value_ = getattr(ctx.config, field)
            if value_ % SHAPE_MULTIPLE:
                ctx.notes.append(f"{field}={value_} is not a multiple of {SHAPE_MULTIPLE}: try "
                                 f"{round_up(value_, SHAPE_MULTIPLE)}")


    def traced(self, value) -> bool:
        return True

    # Framework spellings: Trainer arguments, accelerate, Lightning
    spelled_for_transformers_models = True

    def spelling(self, target, value, cfg) -> Spelling:
        return Spelling(model=(f"model.resize_token_embeddings(model.config.vocab_size, pad_to_multiple_of={VOCAB_MULTIPLE}, "
                               f"mean_resizing=False)  # nice_numbers",))


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


TOGGLE = NiceNumbers()
