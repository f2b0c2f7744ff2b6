"""sequence_packing: a user's variable-length documents packed end to end into full rows, so no compute goes to
padding; each document keeps its own positions and attends only to itself (a block-diagonal causal mask)."""

from __future__ import annotations

from ..data.files import is_data_path
from ..data.packing import check_row_length
from .base import BuildContext, Spelling, Toggle, Tune


class SequencePacking(Toggle):
    name = "sequence_packing"
    summary = ("pack a dataset's variable-length documents into full rows of seq_len tokens, with per-document "
               "position ids and a block-diagonal attention mask")
    cost = "a (batch, 1, seq_len, seq_len) mask per batch; attention still spans the whole row unless a varlen kernel skips the masked blocks"
    helps_when = "documents are much shorter than seq_len, so padded batches are mostly padding"
    group = "data"
    kind = "runtime"
    phase = "data"
    tuning = (Tune(True, rank=75, label="sequence packing"),)

    def changes_nothing(self, cfg) -> str | None:
        if cfg.dataset is None and not is_data_path(cfg.data):
            return ("sequence_packing changes nothing without RunConfig.dataset or a data file (RunConfig.data=PATH): "
                    "it packs variable-length documents (input_ids of any length); the built-in corpus and batch_fn "
                    "make full rows already")
        return None

    def applies_to(self, adapter) -> tuple[bool, str]:
        ok, why = adapter.packed_sequences_support()
        return (True, "") if ok else (False, f"does not apply to {adapter.family}: {why}")

    def apply(self, ctx: BuildContext, value) -> None:
        check_row_length(ctx.config.seq_len)  # refused first, before the model is built
        ctx.pack_sequences = True
        ctx.notes.append(f"sequence_packing: documents packed into rows of {ctx.config.seq_len} tokens; tokens/s "
                         f"counts real tokens only (padding left out)")

    def plan(self, facts, value) -> None:
        facts.packed_rows = True  # rows of seq_len tokens and their (batch, 1, seq_len, seq_len) mask, traced


    # Framework spellings: Trainer arguments, accelerate, Lightning
    def spelling(self, target, value, cfg) -> Spelling:
        if target == "hf":
            # transformers' own collator packs without padding and gives position_ids (flash-attention's route)
            return Spelling(missing="give the Trainer data_collator=DataCollatorWithFlattening() (transformers) "
                                    "with attn_implementation='flash_attention_2'; scalekit's packing builds a 4-D mask instead")
        return Spelling(missing="pack with scalekit.data.packing.PackedDocuments(dataset, seq_len, seed) as the dataset")


TOGGLE = SequencePacking()
