"""What applies to my model: every toggle × {training, generation}, with the one-line reason.

    scalekit.applicable(causal_lm("llama"))          # or a model, a RunConfig, a GenerateConfig, a preset name
    print(scalekit.applicable(my_model))             # the printable form; .frame is the DataFrame

The answer is built from what the toggles declare, never from a model's name: the loops a toggle acts in
(`loops`), whether the model's family can take the change (`applies_to`: the family's KV cache for
kv_cache, with each kind it keeps), whether it would change nothing for this configuration (`changes_nothing`: data toggles on
batches a batch_fn makes), and whether this machine can run it (`available`, or `choice_available` for the mode
a given config chooses: the answer its check_available gives; asked again of a CUDA GPU, so that a toggle that
needs one says "applies here only on a GPU").  The Lab's panel shows the same reasons.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..hf.checkpoint_folder import checkpoint_model
from ..hf.family_of import generation_family, is_hf_source, model_adapter, toggle_family
from ..hf.model import HFCausalLM, is_hf_config
from ..inference.config import GenerateConfig
from ..machine.hardware import Hardware, detect
from ..models import PRESETS
from ..models.gpt import GPT
from ..toggles import LOOP_WORDS, LOOPS, ORDER, Toggle
from ..training.config import RunConfig

APPLIES, GPU_ONLY, UNAVAILABLE, DOES_NOT = "applies", "applies here only on a GPU", "unavailable here", "does not apply"


def reference_gpu(hw: Hardware) -> Hardware:
    """A CUDA GPU with bf16 and TF32 (Ampere or newer), asked what a toggle would need there."""
    return dataclasses.replace(hw, device_type="cuda", device_index=0, device_name="a CUDA GPU", capability=(9, 0),
                               bf16_supported=True, tf32_supported=True)


class Applicability:
    """The table: `frame` (a pandas DataFrame: toggle, loop, status, reason) and a printable form."""

    def __init__(self, rows: list[dict], family: str):
        import pandas as pd

        self.family = family
        self.frame = pd.DataFrame(rows, columns=["toggle", "loop", "status", "reason"])

    def in_loop(self, loop: str) -> Applicability:
        """The toggles that act in `loop` ('train' or 'generate', their `loops`), as a table of their own: the
        others only say they act in the other loop."""
        if loop not in LOOPS:
            raise ValueError(f"loop must be one of {list(LOOPS)}, got {loop!r}")
        acting = {t.name for t in ORDER if loop in t.loops}
        view = Applicability([], self.family)
        view.frame = self.frame[(self.frame.loop == loop) & self.frame.toggle.isin(acting)].reset_index(drop=True)
        return view

    def status(self, toggle: str, loop: str) -> tuple[str, str]:
        row = self.frame[(self.frame.toggle == toggle) & (self.frame.loop == loop)].iloc[0]
        return row.status, row.reason

    def __str__(self) -> str:
        lines = [f"what applies to {self.family}:"]
        for row in self.frame.itertuples():
            why = f" — {row.reason}" if row.reason else ""
            lines.append(f"  {row.toggle:22} {row.loop:9} {row.status}{why}")
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        import pandas as pd

        with pd.option_context("display.max_colwidth", None):  # every reason whole (pandas cuts at 50 characters)
            return f"<p>what applies to {self.family}:</p>" + self.frame.to_html(index=False)


def applicable(model_or_config: Any = None, device: str = "auto", hw: Hardware | None = None) -> Applicability:
    """Every toggle × {train, generate}: applies / applies here only on a GPU / unavailable here / does not
    apply, with the reason.  `model_or_config`: a model (an nn.Module, a Hugging Face model, config or
    causal_lm(...), a checkpoint folder's path), a RunConfig, a GenerateConfig, a preset name, or None (the built-in GPT)."""
    hw = hw or detect(device)
    train_cfg, gen_cfg, model = _configs(model_or_config)
    train_cfg = train_cfg.resolve(hw) if train_cfg is not None else None  # once: the data toggles read its data
    custom = model is not None and not isinstance(model, (str, GPT))
    trained = HFCausalLM(model) if is_hf_config(model) else model  # a transformers config: the model it builds
    families = {"train": toggle_family(trained) if custom else None,
                "generate": generation_family(model) if custom else None}
    chosen = {"train": train_cfg.toggles if train_cfg is not None else {},  # the modes the config asks for
              "generate": gen_cfg.toggles if gen_cfg is not None else {}}
    rows = [dict(toggle=t.name, loop=loop, **dict(zip(("status", "reason"), verdict(
                t, loop, families[loop], train_cfg, hw, value=chosen[loop].get(t.name)), strict=True)))
            for t in ORDER for loop in LOOPS]
    family = families["generate"].family if custom else "the built-in GPT"
    return Applicability(rows, family)


def _configs(source: Any) -> tuple[RunConfig | None, GenerateConfig | None, Any]:
    """The training config the data toggles are asked about, the generation config, and the model."""
    if not (isinstance(source, str) and source in PRESETS):  # a checkpoint folder's path: its family
        source = checkpoint_model(source, "applicable")
    if isinstance(source, RunConfig):
        return source, None, source.model
    if isinstance(source, GenerateConfig):
        return None, source, source.model
    if source is None or isinstance(source, (str, GPT)):
        return RunConfig(preset=source if source in PRESETS else "auto"), None, source
    if is_hf_source(source) or model_adapter(source) is not None:
        return RunConfig(model=source if not is_hf_config(source) else HFCausalLM(source)), None, source
    # a model of your own, fed by a batch_fn (RunConfig.dataset is what the data toggles would act on)
    return RunConfig(model=source, batch_fn=_unused, loss_fn=_unused), None, source


def _unused(*args):
    raise AssertionError("applicable() builds no run")


def verdict(t: Toggle, loop: str, family, train_cfg: RunConfig | None, hw: Hardware,
            launches: bool = False, value: Any = None) -> tuple[str, str]:
    """(status, reason) of toggle `t` in `loop` for a model of `family` (None: the built-in GPT), the resolved
    training config `train_cfg` (its data decides what the data toggles act on; None: not asked) on `hw`.  launches:
    the asker starts the processes a toggle like ddp needs (the Lab), so it is asked as a rank would be.  `value`:
    the mode a config chooses (its availability is that mode's, Toggle.choice_available); None: any mode."""
    if loop not in t.loops:
        where = " and ".join(LOOP_WORDS[x] for x in t.loops)
        return DOES_NOT, f"acts in {where}, not in {LOOP_WORDS[loop]}"
    if family is not None:
        ok, why = t.applies_to(family)
        if not ok:
            return DOES_NOT, f"{t.name} {why}"
    if loop == "train" and train_cfg is not None:
        nothing = t.changes_nothing(train_cfg)
        if nothing:
            return DOES_NOT, nothing
    def runs_on(where: Hardware) -> tuple[bool, str]:
        if launches and t.needs_process_group:
            return t.available_in_ranks(where)
        return t.available(where) if value is None else t.choice_available(where, value)

    ok, why = runs_on(hw)
    if ok:
        return APPLIES, ""
    if hw.device_type != "cuda" and runs_on(reference_gpu(hw))[0]:
        return GPU_ONLY, why
    return UNAVAILABLE, why


__all__ = ["applicable", "verdict", "Applicability", "APPLIES", "GPU_ONLY", "UNAVAILABLE", "DOES_NOT"]
