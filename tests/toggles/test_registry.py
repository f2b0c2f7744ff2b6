"""One registry: a toggle defined here, in the test alone, is listed, validated, applied, planned and searched,
with no other file touched (what a toggle declares on its class is all the rest of scalekit reads)."""

from __future__ import annotations

import importlib.util

import pytest

from scalekit import ConfigError, RunConfig, ToggleUnavailable, estimate, run
from scalekit.autotune import declared_changes, machine_space
from scalekit.cli.main import main
from scalekit.comparison.applicable import APPLIES, applicable
from scalekit.hf.arguments import training_arguments_and_notes
from scalekit.hf.export import TARGETS, export_code
from scalekit.inference.config import GenerateConfig
from scalekit.toggles import (
    GROUPS,
    KINDS,
    ORDER,
    PHASES,
    TOGGLES,
    Toggle,
    Tune,
    exclusions,
    register,
    unregister,
)
from scalekit.toggles import optim as optim_mod
from scalekit.training.batch_finder import find_batch_size
from scalekit.training.finetune import method_lr
from scalekit.widgets.panel import NONE_LABEL
from tests.helpers import CPU, tiny


class EveryOtherStepNote(Toggle):
    """A step-phase toggle with modes that only writes a note: enough to follow it through every table."""

    name = "probe_every_k"
    summary = "a probe toggle defined in the test"
    cost = "nothing"
    helps_when = "never: it is a probe"
    group = "memory"
    phase = "step"
    choices = ("2", "4")
    excludes = {"grad_accum": "the probe and accumulation both change the step"}
    plan_note = "probe_every_k changes no tensor a step keeps"
    tuning = (Tune("2", rank=65, label="probe every 2"),)

    def apply(self, ctx, value) -> None:
        ctx.notes.append(f"probe applied with {value}")


@pytest.fixture
def probe():
    toggle = register(EveryOtherStepNote())
    try:
        yield toggle
    finally:
        unregister(toggle.name)
    assert toggle.name not in TOGGLES and toggle not in ORDER


def test_a_registered_toggle_goes_last_in_its_phase_and_leaves_when_unregistered(probe):
    assert TOGGLES["probe_every_k"] is probe and list(TOGGLES.values()) == ORDER
    step = [t for t in ORDER if t.phase == "step"]
    assert step[-1] is probe
    assert [PHASES.index(t.phase) for t in ORDER] == sorted(PHASES.index(t.phase) for t in ORDER)
    with pytest.raises(ConfigError, match="exists already"):
        register(EveryOtherStepNote())


def test_it_is_validated_with_its_modes_and_its_exclusions(probe):
    assert RunConfig(toggles={"probe_every_k": "4"}).toggles == {"probe_every_k": "4"}
    assert RunConfig(toggles=["probe_every_k"]).toggles == {"probe_every_k": "2"}  # True: its first mode
    with pytest.raises(ConfigError, match=r"probe_every_k.*'2', '4'"):
        RunConfig(toggles={"probe_every_k": "3"})
    assert ("grad_accum", "probe_every_k", "the probe and accumulation both change the step") in exclusions()
    with pytest.raises(ConfigError, match="cannot be on together: the probe and accumulation"):
        RunConfig(toggles={"probe_every_k": "2", "grad_accum": 2})


def test_it_is_listed_applied_and_planned(probe, capsys):
    assert main(["toggles"]) == 0
    assert "probe_every_k" in capsys.readouterr().out
    result = run(tiny(toggles={"probe_every_k": "4"}, steps=1, warmup_steps=0, measure_memory=False))
    assert result.status == "ok" and "probe applied with 4" in result.notes
    plan = estimate(tiny(toggles={"probe_every_k": "4"}))
    assert "probe_every_k changes no tensor a step keeps" in plan.notes
    assert plan.peak_bytes == estimate(tiny()).peak_bytes  # a note, not a change to the plan


def test_autotune_searches_it_at_its_rank(probe):
    labels = [label for label, _, _ in declared_changes("train", CPU)]
    assert labels.index("probe every 2") == labels.index("fused AdamW") + 1  # rank 65: after 60, before 70
    space = machine_space(tiny(), CPU)
    assert ("probe every 2", {"probe_every_k": "2"}) in space.changes
    assert "probe every 2" not in [label for label, _, _ in declared_changes("generate", CPU)]


def test_every_export_lists_it_as_not_carried_with_why(probe):
    cfg = tiny(toggles={"probe_every_k": "2"}, batch_size=8)
    for target in TARGETS:
        code = export_code(cfg, target)
        line = next(line for line in code.splitlines() if "not carried" in line and "probe_every_k" in line)
        assert "no " + target in line or "spelling" in line, line  # says why: it declares no spelling
    _, notes = training_arguments_and_notes(cfg)
    assert any("probe_every_k" in n and "not carried" in n for n in notes)


def test_a_spelling_it_declares_is_what_the_export_writes(probe, monkeypatch):
    from scalekit.toggles import Spelling

    monkeypatch.setattr(EveryOtherStepNote, "spelling", lambda self, target, value, cfg: Spelling(
        kwargs={"probe_field": value} if target == "hf" else {}, notes=(f"probe spelled for {target}",)))
    kwargs, notes = training_arguments_and_notes(tiny(toggles={"probe_every_k": "4"}, batch_size=8))
    assert kwargs["probe_field"] == "4" and "probe spelled for hf" in " ".join(notes)


# -- what a toggle declares is checked, and read instead of its name ------------------------------------------------

def test_an_unknown_group_or_kind_fails_where_the_class_is_defined_naming_the_toggle_field_and_values():
    with pytest.raises(ConfigError, match=r"toggle 'probe_bad_group': group='fine-tuning' is not one of "
                                          r"'precision', .*'finetune'"):
        class BadGroup(Toggle):
            name = "probe_bad_group"
            group = "fine-tuning"
            phase = "step"
    with pytest.raises(ConfigError, match=r"toggle 'probe_bad_kind': kind='speed' is not one of 'runtime', "
                                          r"'memory', 'both'"):
        class BadKind(Toggle):
            name = "probe_bad_kind"
            group = "memory"
            kind = "speed"
            phase = "step"


def test_a_toggle_without_a_group_is_not_registered():
    class NoGroup(Toggle):
        name = "probe_no_group"
        phase = "step"

    with pytest.raises(ConfigError, match=r"toggle 'probe_no_group' has group=''; it must be one of"):
        register(NoGroup())
    assert "probe_no_group" not in TOGGLES


def test_every_toggle_declares_a_known_group_and_kind_and_the_lab_labels_known_groups():
    assert {t.group for t in ORDER} == set(GROUPS)  # every group is used, one spelling each
    assert {t.kind for t in ORDER} <= set(KINDS)
    assert set(NONE_LABEL) <= set(GROUPS)


def test_the_adapter_rate_follows_the_declared_attribute_not_a_name(probe, monkeypatch):
    assert {t.name for t in ORDER if t.trains_few_weights} == {"lora", "dora", "head_only"}
    assert method_lr({"probe_every_k": "2"}, 3e-4, 3e-3) == 3e-4
    monkeypatch.setattr(EveryOtherStepNote, "trains_few_weights", True)
    assert method_lr({"probe_every_k": "2"}, 3e-4, 3e-3) == 3e-3
    assert method_lr({"lora": 8}, 3e-4, 3e-3) == 3e-3 and method_lr({"lora": False}, 3e-4, 3e-3) == 3e-4


def test_the_batch_finder_steps_by_the_declared_micro_batches(probe, monkeypatch):
    budget = 2**30
    with pytest.raises(ConfigError, match=r"start=6 must be a multiple of grad_accum=4"):
        find_batch_size(RunConfig(preset="tiny", device="cpu", toggles={"grad_accum": 4}), budget, start=6)
    monkeypatch.setattr(EveryOtherStepNote, "micro_batches", lambda self, value: int(value))
    with pytest.raises(ConfigError, match=r"start=6 must be a multiple of probe_every_k=4 and at most"):
        find_batch_size(RunConfig(preset="tiny", device="cpu", toggles={"probe_every_k": "4"}), budget, start=6)


# -- availability: one answer per toggle and mode (Toggle.choice_available), asked before anything is built --------

def test_a_toggle_is_available_exactly_when_one_of_its_modes_is():
    for t in ORDER:
        if t.choices is not None:
            assert t.available(CPU)[0] == any(t.choice_available(CPU, c)[0] for c in t.choices), t.name


class FirstPhaseRecorder(Toggle):
    """Applied in the first phase of a build: whether it ran says whether building began."""

    name = "probe_built"
    summary = "records that a build began"
    group = "memory"
    phase = "process"
    plan_note = "probe_built changes nothing"
    applied: list = []

    def apply(self, ctx, value) -> None:
        self.applied.append(value)


@pytest.fixture
def recorder():
    toggle = register(FirstPhaseRecorder())
    toggle.applied.clear()
    try:
        yield toggle
    finally:
        unregister(toggle.name)


def test_check_available_refuses_liger_loss_on_a_cpu_before_building(recorder):
    cfg = tiny(toggles={"probe_built": True, "chunked_cross_entropy": "liger"}, steps=1, warmup_steps=0)
    with pytest.raises(ToggleUnavailable, match=r"RunConfig.toggles: toggle 'chunked_cross_entropy' is "
                                                r"unavailable on this machine: 'liger' is Liger-Kernel's"):
        cfg.check_available(CPU)
    with pytest.raises(ToggleUnavailable, match="'chunked_cross_entropy'"):
        run(cfg)
    assert recorder.applied == []  # refused before the build's first phase
    RunConfig(toggles={"chunked_cross_entropy": 8}).check_available(CPU)  # a count of chunks runs anywhere


def test_check_available_refuses_an_optimizer_whose_library_is_missing_before_building(recorder, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(optim_mod.importlib.util, "find_spec",
                        lambda name, *a: None if name == "bitsandbytes" else real(name, *a))
    cfg = tiny(toggles={"probe_built": True, "optim": "adamw_bnb_8bit"}, steps=1, warmup_steps=0)
    with pytest.raises(ToggleUnavailable, match=r"toggle 'optim' is unavailable on this machine: "
                                                r"optim='adamw_bnb_8bit' needs bitsandbytes, which is not installed"):
        run(cfg)
    assert recorder.applied == []
    RunConfig(toggles={"optim": "adamw_torch_fused"}).check_available(CPU)


def test_generate_config_and_the_cli_ask_the_same_per_mode_answer(capsys):
    ok, why = TOGGLES["quantize"].choice_available(CPU, "gptq")
    assert not ok
    with pytest.raises(ToggleUnavailable, match=r"GenerateConfig.toggles: toggle 'quantize' is unavailable"):
        GenerateConfig(toggles={"quantize": "gptq"}, device="cpu").check_available(CPU)
    assert main(["toggles"]) == 0
    assert f"unavailable here: gptq — {why}" in capsys.readouterr().out


def test_applicable_asks_the_mode_a_config_chooses():
    assert applicable(RunConfig(toggles={"chunked_cross_entropy": 8}), hw=CPU).status(
        "chunked_cross_entropy", "train") == (APPLIES, "")
    status, why = applicable(RunConfig(toggles={"chunked_cross_entropy": "liger"}), hw=CPU).status(
        "chunked_cross_entropy", "train")
    assert status != APPLIES and why == TOGGLES["chunked_cross_entropy"].choice_available(CPU, "liger")[1]
