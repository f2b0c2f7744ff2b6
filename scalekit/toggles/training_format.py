"""training_format: read token windows from the pre-tokenized memmap instead of tokenizing raw text per sample."""

from __future__ import annotations

from ..data.files import is_data_path
from .base import BuildContext, Spelling, Toggle, Tune


class TrainingFormat(Toggle):
    name = "training_format"
    summary = "read the corpus pre-tokenized (a uint16 memmap on disk) instead of tokenizing raw text per sample"
    cost = "a one-time preparation pass, and a file to rebuild whenever the corpus or the tokenizer changes"
    helps_when = "reading, decoding and tokenizing raw text is part of every sample's cost (on every epoch)"
    group = "data"
    phase = "data"
    tuning = (Tune(rank=90),)
    plan_note = "training_format changes where the input pipeline reads its tokens, not a step's memory"

    def changes_nothing(self, cfg) -> str | None:
        if cfg.data != "shakespeare-raw":
            why = {"shakespeare": "it already reads the training format",
                   "dataset": "your dataset reads its samples itself, in its own format (RunConfig.dataset)",
                   "custom": "your batch_fn makes its batches itself"}.get(cfg.data, "no raw text is read")
            if is_data_path(cfg.data):
                why = "a data file is read in the training format always (tokenized once, then from its cache)"
            return f"training_format changes nothing for data={cfg.data!r}: {why}"
        return None

    def apply(self, ctx: BuildContext, value) -> None:
        # the same windows, in the same order: scalekit.data.raw.TokenFile reads them from
        # scalekit.data.load_tokens() (built once, atomically, and checked against its checksum)
        ctx.read_training_format = True

    # Framework spellings: Trainer arguments, accelerate, Lightning
    def spelling(self, target, value, cfg) -> Spelling:
        return Spelling(missing="it reads scalekit's shipped corpus pre-tokenized; the exported code trains on your "
                                "train_dataset, and no framework has a switch for how that was made")


TOGGLE = TrainingFormat()
