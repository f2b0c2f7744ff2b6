"""The Lab's toggle panel: one control per toggle, grouped as the course groups them.

Built from `scalekit.toggles.ORDER`, never from a hand-written list, so a toggle added there shows up
here.  An on/off toggle is a checkbox; a toggle with modes (compile mode, accumulation steps) is a
dropdown; toggles of one group that all exclude each other (bf16 / fp16, as their `excludes` say) share one
dropdown whose first entry means "none of them" (for precision: fp32).  An unavailable toggle is
disabled, or left out of its dropdown, and its reason is written beside it.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import ipywidgets as w

from ..comparison.applicable import APPLIES, verdict
from ..errors import ConfigError, ToggleUnavailable
from ..toggles import ORDER, Toggle

OFF = "off"
# What "none of the exclusive toggles" means, where the group has a better word for it than "off".
NONE_LABEL = {"precision": "fp32", "optimizer": "AdamW (default)", "finetune": "full fine-tuning"}


@dataclass
class ToggleControl:
    """One control of the panel and the toggles it sets."""

    key: str  # the toggle's name, or the group's name for a dropdown of exclusive toggles
    widget: w.ValueWidget  # Checkbox or Dropdown
    names: tuple[str, ...]  # the toggles this control can switch on
    choices: dict[Any, dict[str, Any]]  # the widget's value -> the toggles it selects ({} for off)
    off: Any = False  # the widget's value for "none of them"
    reasons: dict[str, str] = field(default_factory=dict)  # unavailable toggle -> why
    row: w.Widget | None = None  # the control with its summary (or reason) beside it
    note: w.HTML | None = None
    usable: bool = True  # enabled when no run is going (False: nothing in it can run here)

    def selected(self) -> dict[str, Any]:
        """{toggle name: value} for RunConfig.toggles; empty when the control is off."""
        return dict(self.choices[self.widget.value])

    def set(self, value: Any) -> None:
        """Select by the widget's value; False or None mean off."""
        if value is None or value is False:
            value = self.off
        if value not in self.choices:
            allowed = ", ".join(repr(v) for v in self.choices)
            raise ConfigError(f"Lab control {self.key!r}: {value!r} is not one of {allowed}")
        for name in self.choices[value]:
            if name in self.reasons:
                raise ToggleUnavailable(f"Lab: toggle {name!r} cannot be switched on here: {self.reasons[name]}")
        self.widget.value = value


def control_sets(toggles: Sequence[Toggle], exclusive) -> list[list[Toggle]]:
    """Toggles partitioned into controls, in ORDER: toggles of one group that all exclude each other share one.

    Exclusion is not transitive (fp16 excludes deepspeed, which excludes ddp, yet fp16 and ddp go together),
    so a set only takes a toggle that excludes every member already in it.  Pairs left in separate
    controls are flagged by `TogglePanel.conflicts` and refused by RunConfig if run.
    """
    pairs = {frozenset((a, b)) for a, b, _why in exclusive}
    sets: list[list[Toggle]] = []
    for t in toggles:
        for s in sets:
            if s[0].group == t.group and all(frozenset((t.name, m.name)) in pairs for m in s):
                s.append(t)
                break
        else:
            sets.append([t])
    return sets


def unavailable_reason(toggle: Toggle, hw, custom_model: bool, launches: bool = False, adapter=None,
                       loop: str = "train", config=None) -> str:
    """Why `toggle` cannot be switched on here ("" if it can): the reason scalekit.applicable gives.  With
    `launches`, the panel's owner starts the processes a toggle like ddp needs, so it is asked as a rank of
    such a launch would be.  `adapter`: the model's family (what it can change); `config`: the run's resolved
    config, whose data decides what the data toggles act on."""
    if loop not in toggle.loops:  # a generation toggle in a training Lab acts on its evaluation (eval_every)
        loop = toggle.loops[0]
    status, why = verdict(toggle, loop, adapter if custom_model else None, config, hw, launches)
    return "" if status == APPLIES else (why or "unavailable on this machine")


def _checkbox(t: Toggle, reason: str):
    widget = w.Checkbox(value=False, description=t.name, indent=False, disabled=bool(reason),
                        tooltip=f"{t.summary}. Cost: {t.cost}" if t.cost else t.summary,
                        layout=w.Layout(width="170px"))
    return widget, {False: {}, True: {t.name: True}}, False


def _dropdown(description: str, choices: dict[Any, dict], labels: list[str], off: Any, tooltip: str):
    # values are never None: ipywidgets reads a None value as "nothing selected" and shows a blank box
    widget = w.Dropdown(options=list(zip(labels, choices, strict=True)), value=off, description=description,
                        disabled=len(choices) == 1, tooltip=tooltip, style={"description_width": "initial"},
                        layout=w.Layout(width="290px"))
    return widget, choices, off


def _modes_dropdown(t: Toggle, reason: str, left_out: dict | None = None):
    offered = [c for c in t.choices if c not in (left_out or {})]  # modes this machine cannot run are left out
    choices = {OFF: {}, **{c: {t.name: c} for c in offered}}
    widget, choices, off = _dropdown(t.name, choices, [OFF] + [str(c) for c in offered], OFF, t.summary)
    widget.disabled = bool(reason)
    return widget, choices, off


def unavailable_modes(t: Toggle, hw, reason: str) -> dict:
    """{mode: why} for the modes of `t` that cannot run here although `t` itself can (quantization methods)."""
    out = {}
    for c in () if reason or t.choices is None else t.choices:
        ok, why = t.choice_available(hw, c)
        if not ok:
            out[c] = why
    return out


def _exclusive_dropdown(key: str, members: list[Toggle], reasons: dict[str, str]):
    off = NONE_LABEL.get(key, OFF)
    entries: list[tuple[str, str, dict]] = []  # (toggle, label, selection)
    for t in members:
        if t.name in reasons:
            continue  # an unavailable member is left out; its reason is shown beside the dropdown
        if t.choices is None:
            entries.append((t.name, t.name, {t.name: True}))
        else:
            entries += [(t.name, str(c), {t.name: c}) for c in t.choices]
    labels = [label for _, label, _ in entries]
    if len(set(labels)) < len(labels) or off in labels:  # the same mode in two toggles: say whose
        entries = [(n, label if label == n else f"{n} {label}", sel) for n, label, sel in entries]
    choices = {off: {}, **{label: sel for _, label, sel in entries}}
    tooltip = "; ".join(f"{t.name}: {t.summary}" for t in members)
    return _dropdown(key, choices, list(choices), off, tooltip)


def _note(text: str, unavailable: bool) -> w.HTML:
    colour = "#b45309" if unavailable else "#6b7280"
    return w.HTML(f'<span style="color:{colour};font-size:0.85em">{html.escape(text)}</span>')


class TogglePanel:
    """The controls, grouped, and what they select."""

    def __init__(self, hw, custom_model: bool = False, toggles: Sequence[Toggle] = ORDER, exclusive=None,
                 launches: bool = False, adapter=None, loop: str = "train", config=None):
        self.controls: dict[str, ToggleControl] = {}
        # the pairs that cannot be on together, as the toggles shown declare them (Toggle.excludes)
        self.exclusive = exclusive if exclusive is not None else \
            [(other, t.name, why) for t in toggles for other, why in t.excludes.items()]
        names = {t.name for t in toggles}
        groups: dict[str, list[w.Widget]] = {}
        config = config.resolve(hw) if config is not None else None  # once: the data toggles read its data
        for members in control_sets(toggles, self.exclusive):
            t = members[0]
            reasons = {m.name: r for m in members if (r := unavailable_reason(m, hw, custom_model, launches,
                                                                                   adapter, loop, config))}
            if len(members) > 1:
                # named after its group unless that name is taken (by a toggle, or another set in the group)
                key = t.group if t.group and t.group not in names and t.group not in self.controls \
                    else "/".join(m.name for m in members)
                widget, choices, off = _exclusive_dropdown(key, members, reasons)
                text = "; ".join(f"{m.name}: {m.summary}" if m.name not in reasons
                                 else f"{m.name} unavailable: {reasons[m.name]}" for m in members)
            else:
                key = t.name
                reason = reasons.get(t.name, "")
                left_out = unavailable_modes(t, hw, reason)
                widget, choices, off = _checkbox(t, reason) if t.choices is None else _modes_dropdown(t, reason, left_out)
                text = f"unavailable: {reason}" if reason else t.summary
                if left_out:
                    text += " — not here: " + "; ".join(f"{c}: {why}" for c, why in left_out.items())
            widget.add_class(f"scalekit-toggle-{key}")
            note = _note(text, bool(reasons))
            control = ToggleControl(key, widget, tuple(m.name for m in members), choices, off, reasons,
                                    row=w.HBox([widget, note]), note=note, usable=not widget.disabled)
            self.controls[key] = control
            groups.setdefault(t.group, []).append(control.row)  # one heading per group (toggles.vocabulary.GROUPS)
        self.widget = w.VBox([w.VBox([w.HTML(f"<b>{html.escape(g)}</b>"), *rows]) for g, rows in groups.items()])
        self.widget.add_class("scalekit-toggles")

    def selected(self) -> dict[str, Any]:
        """Every control's selection, merged: the `toggles` of the next RunConfig."""
        out: dict[str, Any] = {}
        for control in self.controls.values():
            out.update(control.selected())
        return out

    def clear(self) -> None:
        """Every control back to off."""
        for control in self.controls.values():
            control.widget.value = control.off

    def preselect(self, toggles: dict[str, Any]) -> None:
        """Switch the controls to `toggles` ({name: validated value}, as in a RunConfig)."""
        for name, value in toggles.items():
            control = next(c for c in self.controls.values() if name in c.names)
            if name in control.reasons:
                raise ToggleUnavailable(f"Lab: toggle {name!r} cannot be switched on here: {control.reasons[name]}")
            offered = [v for v, sel in control.choices.items() if sel == {name: value}]
            if not offered:
                raise ConfigError(f"Lab control {control.key!r} does not offer {name}={value!r}; it offers: "
                                  f"{', '.join(str(v) for v in control.choices if v != control.off)}")
            control.widget.value = offered[0]

    def conflicts(self) -> list[str]:
        """Pairs switched on together that cannot run together (they sit in different controls), and why."""
        on = self.selected()
        return [f"{a} and {b} cannot be on together: {why}" for a, b, why in self.exclusive if a in on and b in on]

    def set_locked(self, locked: bool) -> None:
        """Freeze the controls while a run goes (a change would not apply to it); unusable ones stay disabled."""
        for control in self.controls.values():
            control.widget.disabled = locked or not control.usable
