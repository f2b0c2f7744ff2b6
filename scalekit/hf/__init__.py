"""The Transformers bridge: Hugging Face models through scalekit's toggles, TrainingArguments in and out, and
a Trainer callback that measures a Trainer run the way scalekit measures its own.

    spec = scalekit.hf.causal_lm("llama", preset="small")        # built offline from a config
    scalekit.run(RunConfig(model=spec, toggles=["bf16", "sdpa"]))
    cfg = RunConfig.from_training_arguments(args, model=spec)   # and cfg.to_training_arguments()
    trainer = Trainer(..., callbacks=[scalekit.hf.ScalekitCallback()])

Only `scalekit.hf.model` and `scalekit.hf.data` are imported with the package: it needs no transformers until a model is built.  The
callback (a transformers.TrainerCallback) and the exporters load when first asked for.
"""

from __future__ import annotations

from .data import CorpusDataset
from .model import FAMILIES, HFCausalLM, causal_lm, is_hf_config, is_hf_model, model_config

__all__ = ["FAMILIES", "CorpusDataset", "HFCausalLM", "ScalekitCallback", "causal_lm", "export_code", "is_hf_config",
           "is_hf_model", "model_config"]


def __getattr__(name):
    # the callback subclasses transformers.TrainerCallback, and the exporters read RunConfig: load them when asked
    if name == "ScalekitCallback":
        from .callback import ScalekitCallback

        return ScalekitCallback
    if name == "export_code":
        from .export import export_code

        return export_code
    raise AttributeError(f"module 'scalekit.hf' has no attribute {name!r}")
