"""Each toggle's file reads top-down: what the toggle declares, the checks asked before a run is built, then what
it does (`apply`), then what it tells the planner, then how the frameworks spell it under one heading comment;
`TOGGLE = ...` last.  Read from the files' source (ast), so a member moved out of place fails here, naming it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import scalekit.toggles
from scalekit.toggles import ORDER
from scalekit.toggles.base import Toggle

TOGGLES_DIR = Path(scalekit.toggles.__file__).parent
# the interface, CountToggle, the registry, and what toggles share (tests/project/test_architecture.py: TOGGLE_HELPERS)
NOT_TOGGLES = {"__init__.py", "base.py", "counted.py", "vocabulary.py", "facts.py", "stepper.py", "source.py"}
TOGGLE_FILES = sorted(p for p in TOGGLES_DIR.glob("*.py") if p.name not in NOT_TOGGLES)

HEADING = "# Framework spellings: Trainer arguments, accelerate, Lightning"

# The members of base.Toggle a toggle class may define, by the part of the file they belong to.
CHECKS = {  # asked before anything is built: whether the toggle, with a value, can run here and on this model
    "available", "choice_available", "available_in_ranks", "changes_nothing", "applies_to", "choice_applies",
    "config_applies", "validate",
    "loaded_quantized",  # (and how a checkpoint folder's weights are to be loaded)
}
PLAN = {  # what the planner (and the batch-size finder, and the mesh built before the toggles act) reads of it
    "plan", "traced", "planned", "micro_batches", "mesh_dims",
}
SPELLING = {  # how scalekit.hf.arguments and scalekit.hf.export translate it to and from the frameworks
    "training_fields", "spelled_for_transformers_models", "from_training_arguments", "spelling", "off_spelling",
}
# apply, which the order is told around, and members of base.Toggle that toggles do not redefine
NOT_ORDERED = {"apply", "explainer", "code"}


def member_name(node: ast.stmt) -> str | None:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return node.name
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    return None


def toggle_class(tree: ast.Module) -> ast.ClassDef | None:
    """The class `TOGGLE = X()` instantiates (None when that is not the module's last statement)."""
    last = tree.body[-1] if tree.body else None
    if not (isinstance(last, ast.Assign) and [ast.unparse(t) for t in last.targets] == ["TOGGLE"]
            and isinstance(last.value, ast.Call) and isinstance(last.value.func, ast.Name)):
        return None
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == last.value.func.id), None)


def first_line(node: ast.stmt) -> int:
    """The 1-based first line of `node`, its decorators included."""
    return min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])


def run_at_import(node: ast.stmt) -> set[str]:
    """The names a top-level statement reads while the module is imported: a def's decorators and default
    arguments, a class's bases and the values of its attributes (with these, its methods' defaults), anything else
    whole.  Annotations are not read (`from __future__ import annotations`)."""
    def names(*parts) -> set[str]:
        return {n.id for part in parts if part is not None for n in ast.walk(part) if isinstance(n, ast.Name)}

    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return names(*node.decorator_list, *node.args.defaults, *node.args.kw_defaults)
    if isinstance(node, ast.ClassDef):
        read = names(*node.decorator_list, *node.bases, *(k.value for k in node.keywords))
        return read.union(*(run_at_import(m) for m in node.body))
    if isinstance(node, ast.AnnAssign):
        return names(node.value)
    return names(node)


def helpers_above(tree: ast.Module, cls: ast.ClassDef) -> list[str]:
    """Functions and classes defined above the toggle class that could be defined below it: nothing run while the
    module is imported, up to the end of the class, reads them."""
    above = tree.body[:tree.body.index(cls)]
    defs = {n.name: n for n in above if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    read = set().union(*(run_at_import(n) for n in [*above, cls] if n not in defs.values()))
    grew = True
    while grew:  # a definition that must stay above brings what its own import-time code, or its body, reads
        kept = [d for name, d in defs.items() if name in read]
        more = set().union(*(run_at_import(d) | {n.id for n in ast.walk(d) if isinstance(n, ast.Name)}
                             for d in kept))
        grew = not more <= read
        read |= more
    return [name for name in defs if name not in read]


def out_of_order(source: str) -> list[str]:
    """What in a toggle file's source breaks the top-down order, in words (empty: it reads top-down)."""
    tree = ast.parse(source)
    lines = source.splitlines()
    cls = toggle_class(tree)
    if cls is None:
        return ["`TOGGLE = <its class>()` is not the module's last statement"]
    problems = [f"{name} is defined above the class {cls.name}, and nothing run at import reads it before the "
                f"class: define it below the class" for name in helpers_above(tree, cls)]
    members = [(member_name(m), m) for m in cls.body]
    methods = [i for i, (_, m) in enumerate(members) if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for name, node in members[methods[0]:] if methods else []:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and name not in SPELLING:
            problems.append(f"{cls.name}.{name} is declared after the first method: declared attributes come first")

    def positions(names: set[str]) -> list[tuple[int, str]]:
        return [(i, name) for i, (name, _) in enumerate(members) if name in names]

    apply = positions({"apply"})
    if not apply:
        return [*problems, f"{cls.name} defines no apply"]
    at_apply = apply[0][0]
    checks, plan, spelling = positions(CHECKS), positions(PLAN), positions(SPELLING)
    problems += [f"{cls.name}.{name} comes after apply: the checks before a run is built come before it"
                 for i, name in checks if i > at_apply]
    problems += [f"{cls.name}.{name} comes before apply: the plan follows what the toggle does"
                 for i, name in plan if i < at_apply]
    problems += [f"{cls.name}.{name} comes before apply: the framework spellings come last"
                 for i, name in spelling if i < at_apply]
    # the class's own methods apply calls (self.x(...), x not a Toggle member) follow it, before the plan
    calls = {c.func.attr for c in ast.walk(members[at_apply][1]) if isinstance(c, ast.Call)
             and isinstance(c.func, ast.Attribute) and isinstance(c.func.value, ast.Name) and c.func.value.id == "self"}
    after = min([i for i, _ in plan + spelling if i > at_apply], default=len(members))
    problems += [f"{cls.name}.{name}, which apply calls, is not right after apply (before the plan)"
                 for i, name in positions(calls - set(dir(Toggle))) if not at_apply < i < after]
    if plan and spelling:
        problems += [f"{cls.name}.{name} comes before the plan ({plan[-1][1]}): the framework spellings come last"
                     for i, name in spelling if i < plan[-1][0]]
    if spelling:
        first = spelling[0]
        # the comment lines right above the first spelling member (its own comments may sit under the heading)
        above, line = [], first_line(members[first[0]][1]) - 1  # 1-based line just above it
        while line >= 1 and lines[line - 1].strip().startswith("#"):
            above.append(lines[line - 1].strip())
            line -= 1
        if not above or above[-1] != HEADING:
            problems.append(f"{cls.name}.{first[1]}, the first framework spelling, has no {HEADING!r} right above it")
    headings = [n for n, text in enumerate(lines, 1) if text.strip() == HEADING]
    if len(headings) > (1 if spelling else 0):
        problems.append(f"the heading {HEADING!r} stands {len(headings)} times; "
                        f"{'once, above the first spelling' if spelling else 'there is no spelling member'}")
    return problems


def test_every_toggle_file_is_found():
    # the files read here are those the built-in toggles are defined in, every one of them
    homes = {type(t).__module__.rsplit(".", 1)[1] + ".py" for t in ORDER
             if type(t).__module__.startswith("scalekit.toggles.")}
    assert homes == {p.name for p in TOGGLE_FILES}
    assert len(TOGGLE_FILES) >= 39


def test_the_member_sets_name_members_of_toggle():
    # base.Toggle renaming or dropping one of these would leave the order below checking nothing
    for name in CHECKS | PLAN | SPELLING | NOT_ORDERED:
        assert hasattr(Toggle, name), f"base.Toggle has no {name}: update the sets in this test"
    assert not (CHECKS & PLAN or CHECKS & SPELLING or PLAN & SPELLING)


@pytest.mark.parametrize("path", TOGGLE_FILES, ids=lambda p: p.stem)
def test_toggle_file_reads_top_down(path: Path):
    assert out_of_order(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("path", TOGGLE_FILES, ids=lambda p: p.stem)
def test_every_toggle_member_the_file_defines_has_a_place(path: Path):
    # a hook base.Toggle gains and a toggle defines must be put in one of the sets above, so its place is checked
    cls = toggle_class(ast.parse(path.read_text(encoding="utf-8")))
    assert cls is not None
    unplaced = {member_name(m) for m in cls.body} & {n for n in vars(Toggle) if not n.startswith("_")}
    unplaced -= CHECKS | PLAN | SPELLING | NOT_ORDERED
    # the declared attributes (name, summary, ...) are class attributes of Toggle that are not callables
    unplaced = {n for n in unplaced if callable(getattr(Toggle, n)) or isinstance(vars(Toggle)[n], property)}
    assert not unplaced, f"{path.name}: put {sorted(unplaced)} in one of this test's member sets"


HEAD = '''"""A toggle."""

from .base import Spelling, Toggle


class T(Toggle):
    name = "t"

    def available(self, hw):
        return True, ""

'''
APPLY = '''    def apply(self, ctx, value):
        ctx.notes.append(helper())

'''
PLAN_HOOK = '''    def plan(self, facts, value):
        facts.analytic = False

'''
SPELLINGS = f'''    {HEADING}
    training_fields = {{"t": False}}

    def spelling(self, target, value, cfg):
        return Spelling()

'''
HELPER = '''
def helper():
    return "t"

'''
LAST = "\nTOGGLE = T()\n"


def test_the_checker_sees_each_kind_of_disorder():
    assert out_of_order(HEAD + APPLY + PLAN_HOOK + SPELLINGS + HELPER + LAST) == []
    said = {
        "plan follows": HEAD + PLAN_HOOK + APPLY + SPELLINGS + HELPER + LAST,
        "come last": HEAD + APPLY + SPELLINGS + PLAN_HOOK + HELPER + LAST,
        "checks before": HEAD + APPLY + PLAN_HOOK.replace("plan(self, facts", "changes_nothing(self, cfg") + HELPER + LAST,
        "right above it": HEAD + APPLY + PLAN_HOOK + SPELLINGS.replace(HEADING, "# spellings") + HELPER + LAST,
        "declared after": HEAD + APPLY + "    plan_note = 'x'\n\n" + PLAN_HOOK + HELPER + LAST,
        "last statement": HEAD + APPLY + PLAN_HOOK + SPELLINGS + LAST + HELPER,
        "right after apply": HEAD + "    def note(self):\n        return 't'\n\n"
        + APPLY.replace("helper()", "self.note()") + PLAN_HOOK + LAST,
        "define it below": HEAD.replace("class T", HELPER.lstrip() + "\nclass T") + APPLY + PLAN_HOOK + LAST,
    }
    kept_above = HEAD.replace("class T", HELPER.lstrip() + "\nclass T").replace('name = "t"', "name = helper()")
    assert out_of_order(kept_above + APPLY + PLAN_HOOK + SPELLINGS + LAST) == []
    note_after_apply = HEAD + APPLY.replace("helper()", "self.note()") + "    def note(self):\n        return 't'\n\n"
    assert out_of_order(note_after_apply + PLAN_HOOK + SPELLINGS + HELPER + LAST) == []
    for words, source in said.items():
        assert any(words in problem for problem in out_of_order(source)), (words, out_of_order(source))
