"""vectorized_transforms: apply the per-sample transform to the whole batch with tensor ops, not a Python loop."""

from __future__ import annotations

from .base import BuildContext, Spelling, Toggle, Tune


class VectorizedTransforms(Toggle):
    name = "vectorized_transforms"
    summary = "apply the per-sample transform (character noise) to the whole batch at once with tensor ops"
    cost = "the transform must be written as tensor ops over a batch, and give the same result as the loop"
    helps_when = "a per-sample Python transform (augmentation, masking, noise) is a share of the data wait"
    group = "data"
    phase = "data"
    tuning = (Tune(rank=100),)
    plan_note = ('vectorized_transforms changes how the input pipeline transforms a batch (its temporaries are '
                 "the size of one batch), not a step's memory")

    def changes_nothing(self, cfg) -> str | None:
        if cfg.data in ("dataset", "custom"):
            return ("vectorized_transforms changes nothing for your own data: its per-sample transforms are your "
                    "code (write them over the whole batch in a collate_fn for the same effect)")
        if cfg.data != "shakespeare-raw" or not cfg.transform_rounds:
            return ("vectorized_transforms changes nothing here: this data has no per-sample transform "
                    "(data='shakespeare-raw' with transform_rounds > 0 has one)")
        return None

    def apply(self, ctx: BuildContext, value) -> None:
        # the collate function (scalekit.data.raw.Collate) then calls noise_batch on the stacked batch,
        # in the worker processes when there are workers; samples are no longer noised one by one
        ctx.batch_transforms = True

    # Framework spellings: Trainer arguments, accelerate, Lightning
    def spelling(self, target, value, cfg) -> Spelling:
        return Spelling(missing="it batches the per-sample transform of scalekit's raw corpus; your train_dataset has "
                                "no such transform, and no framework has a switch for one")


TOGGLE = VectorizedTransforms()
