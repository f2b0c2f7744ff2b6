"""README's toggle table is checked against the registry: one row per toggle, no row for a toggle that does not
exist, each row's group and modes what the toggle declares.  The descriptions stay hand-written."""

from __future__ import annotations

from pathlib import Path

from scalekit.toggles import ORDER, TOGGLES

README = Path(__file__).resolve().parents[2] / "README.md"
HEADER = "| toggle | group | modes | what it is |"
NO_MODES = "on/off"


def table_rows(text: str) -> list[list[str]]:
    """The cells of the toggle table's rows (the lines after its header and rule, up to the first non-row)."""
    lines = text.splitlines()
    start = lines.index(HEADER) + 2  # the header, then the |---| rule
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def modes_said(toggle) -> str:
    return NO_MODES if toggle.choices is None else ", ".join(str(c) for c in toggle.choices)


def table_problems(text: str) -> list[str]:
    """What the table says that the registry does not, one line each (none: they agree)."""
    problems, seen = [], []
    for cells in table_rows(text):
        if len(cells) != 4:
            problems.append(f"row {cells[0] if cells else '?'}: {len(cells)} cells, not 4")
            continue
        name, group, modes, _what = cells
        name = name.strip("`")
        if name in seen:
            problems.append(f"{name}: two rows")
        seen.append(name)
        toggle = TOGGLES.get(name)
        if toggle is None:
            problems.append(f"{name}: a row, but no such toggle")
            continue
        if group != toggle.group:
            problems.append(f"{name}: group {group!r} in README, {toggle.group!r} declared")
        if modes != modes_said(toggle):
            problems.append(f"{name}: modes {modes!r} in README, {modes_said(toggle)!r} declared")
    problems += [f"{t.name}: no row" for t in ORDER if t.name not in seen]
    return problems


def test_readme_has_one_row_per_toggle_with_its_group_and_modes():
    assert table_problems(README.read_text(encoding="utf-8")) == []


def test_the_check_finds_a_missing_row_an_unknown_toggle_and_wrong_modes():
    text = README.read_text(encoding="utf-8")
    lora_row = next(line for line in text.splitlines() if line.startswith("| `lora` |"))
    assert table_problems(text.replace(lora_row + "\n", "")) == ["lora: no row"]
    unknown = lora_row.replace("`lora`", "`lora_plus`")
    assert table_problems(text.replace(lora_row, f"{lora_row}\n{unknown}")) == ["lora_plus: a row, but no such toggle"]
    assert table_problems(text.replace(lora_row, lora_row.replace("8, 4, 16, 64", "8, 4, 16"))) == \
        ["lora: modes '8, 4, 16' in README, '8, 4, 16, 64' declared"]
    assert table_problems(text.replace(lora_row, lora_row.replace("| finetune |", "| fine-tuning |"))) == \
        ["lora: group 'fine-tuning' in README, 'finetune' declared"]
