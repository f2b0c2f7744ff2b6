"""One registry: a toggle defined here, in the test alone, is listed, validated, applied, planned and searched,
with no other file touched (what a toggle declares on its class is all the rest of scalekit reads)."""

from __future__ import annotations

import pytest

from scalekit import ConfigError, RunConfig, estimate, run
from scalekit.autotune import declared_changes, machine_space
from scalekit.cli import main
from scalekit.hf.arguments import training_arguments_and_notes
from scalekit.hf.export import TARGETS, export_code
from scalekit.toggles import ORDER, PHASES, TOGGLES, Toggle, Tune, exclusions, register, unregister
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
