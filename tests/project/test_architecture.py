"""The seams of the package: no import cycles, a leaf multi-process runtime, a declared build context,
toggles that meet in context fields (never by each other's names), one block finder, short functions."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
from pathlib import Path

import pytest
import torch

import scalekit
from scalekit.measure import flops
from scalekit.models.blocks import find_blocks
from scalekit.toggles import ORDER, PHASES, TOGGLES, BuildContext
from scalekit.training import build as training
from tests.helpers import CPU, built, tiny

PACKAGE = Path(scalekit.__file__).parent
MAX_FUNCTION_LINES = 50


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes under an `if TYPE_CHECKING:` block (imports there never run)."""
    return {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
            and getattr(node.test, "id", "") == "TYPE_CHECKING" for n in ast.walk(node)}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every scalekit module `name` imports, at module level or inside functions (TYPE_CHECKING excluded)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    type_only = type_checking_nodes(tree)
    found = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from x import y` imports the module x.y when there is one, else a name from x
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        found |= {t for t in targets if t in known and t != name}
    return found


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_import_graph_finder_sees_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    graph = import_graph()
    assert "scalekit.toggles.base" in graph["scalekit.toggles.fsdp"]  # relative imports resolved
    assert "scalekit.distributed.runtime" in graph["scalekit.training.engine"]


def test_no_import_cycles_inside_scalekit():
    graph = import_graph()
    # the package's own __init__ only re-exports; a submodule importing `scalekit` itself would be a cycle
    assert find_cycle(graph) is None, " → ".join(find_cycle(graph))


def test_the_multi_process_runtime_is_a_leaf_and_launch_only_starts_processes():
    graph = import_graph()
    assert not any(m.startswith(("scalekit.toggles", "scalekit.launch", "scalekit.training.engine"))
                   for m in graph["scalekit.distributed.runtime"])
    for name, deps in graph.items():
        if name.startswith("scalekit.toggles"):
            assert not any(d.startswith("scalekit.launch") for d in deps), name


# Imports only run down.  LAYERS orders every module of the package, lowest first: a module may import its own
# layer and the layers below it, never one above (the longest prefix places a module; the package root,
# scalekit/__init__, is the façade over everything).  The packages group modules by job; a job's leaf modules may
# sit lower than its package (cli.fields, comparison.repeats), and one module above it (machine.doctor).
LAYERS = (
    # the modules loose at the top, and the leaves of other jobs: each imports nothing of scalekit above these
    ("foundations", ("scalekit.errors", "scalekit.optional", "scalekit.files", "scalekit.checks",
                     "scalekit.course.published_figures", "scalekit.comparison.repeats",
                     "scalekit.cli.fields",  # flags from any dataclass's fields
                     "scalekit.models.import_spec")),  # code of your own named package.module:name, imported
    ("machine", ("scalekit.machine", "scalekit.distributed.sharding")),  # facts of this machine; meshes, FSDP2 options
    ("measure", ("scalekit.measure", "scalekit.training.results",
                 "scalekit.training.report")),  # timing, memory, FLOPs and MFU, results and their tables
    ("data", ("scalekit.data",)),
    ("models", ("scalekit.models",)),  # and their weights and LoRA adapters on disk
    ("runtime", ("scalekit.distributed",)),  # the multi-process runtime the toggles and the engine join
    ("toggles", ("scalekit.toggles",)),
    ("hf", ("scalekit.hf",)),  # the Transformers bridge: the family, the Trainer's arguments and callback
    # which family a model gets (yours, Hugging Face's, or a plain module's), and which tokenizer its data file goes through
    ("families", ("scalekit.hf.family_of", "scalekit.hf.tokenizer_of")),
    ("config", ("scalekit.training.config",)),
    ("generation", ("scalekit.inference",)),
    ("training", ("scalekit.training.build", "scalekit.training.evaluation")),
    ("plan", ("scalekit.plan",)),
    ("engine", ("scalekit.training.engine",)),
    # what is built on runs: training's studies and ladder, comparison, the search, the course, the doctor
    ("runs", ("scalekit.training", "scalekit.comparison", "scalekit.autotune", "scalekit.course",
              "scalekit.machine.doctor")),
    ("launch", ("scalekit.launch",)),
    # beyond the ranks in hand (its calibrate() starts gloo ranks); saved_activations walks a step on fake tensors with
    # the toggles' checkpointing and the memory timeline, both below it
    ("predict", ("scalekit.predict", "scalekit.predict.saved_activations")),
    ("interfaces", ("scalekit.cli", "scalekit.widgets")),
)
ROOT = "scalekit"  # the façade: it may import anything


def layer_of(name: str) -> int | None:
    """The index in LAYERS of module `name`'s layer (its longest matching prefix), None if no layer holds it."""
    matches = [(len(prefix), i) for i, (_, prefixes) in enumerate(LAYERS) for prefix in prefixes
               if name == prefix or name.startswith(prefix + ".")]
    return max(matches)[1] if matches else None


# Sideways (same or lower layer, and still wrong) or spelled out for the seams that matter most: each rule names a
# part of the package and what it must never import.
LOOP = ("scalekit.training.engine", "scalekit.training.build", "scalekit.training.evaluation",  # run loops
        "scalekit.inference.engine", "scalekit.inference.loop")
ABOVE_TRAINING = ("scalekit.training.engine", "scalekit.plan", "scalekit.training.finetune",
                  "scalekit.training.batch_finder", "scalekit.autotune", "scalekit.training.ladder", "scalekit.launch",
                  "scalekit.cli", "scalekit.widgets", "scalekit.comparison.compare", "scalekit.course")
NEVER = (
    ("scalekit.models", ("scalekit.hf", "scalekit.toggles", "scalekit.inference", "scalekit.training.engine",
                         "scalekit.training.build", "scalekit.widgets")),
    ("scalekit.data", ("scalekit.toggles", "scalekit.models", "scalekit.inference", "scalekit.training.engine",
                       "scalekit.widgets")),
    ("scalekit.toggles", (*LOOP, "scalekit.inference", "scalekit.plan", "scalekit.autotune", "scalekit.hf",
                          "scalekit.hf.family_of", "scalekit.training.config", "scalekit.widgets", "scalekit.launch")),
    ("scalekit.measure", ("scalekit.toggles", "scalekit.training.engine", "scalekit.training.build", "scalekit.inference",
                          "scalekit.widgets")),
    ("scalekit.errors", ("scalekit",)),
    ("scalekit.checks", ("scalekit.toggles", "scalekit.training.config", "scalekit.models")),
    # the Transformers bridge sits under the families and the config that import it, so it reaches no run
    ("scalekit.hf", (*LOOP, "scalekit.hf.family_of", "scalekit.training.config", "scalekit.inference", *ABOVE_TRAINING)),
    # generation never imports training's code, only its config (a ladder may start from a RunConfig); training's
    # evaluator imports generation's decode loop
    ("scalekit.inference", ("scalekit.training.build", "scalekit.training.evaluation", "scalekit.training.results",
                            "scalekit.training.report", *ABOVE_TRAINING)),
    # training, whole: it is run by the launcher, the command line and the Lab, never the other way round
    ("scalekit.training", ("scalekit.launch", "scalekit.cli", "scalekit.widgets", "scalekit.autotune",
                           "scalekit.comparison.compare", "scalekit.comparison.applicable")),
    ("scalekit.training.build", ABOVE_TRAINING),
    ("scalekit.training.evaluation", ABOVE_TRAINING),
)
TOGGLE_HELPERS = ("scalekit.toggles.base", "scalekit.toggles.counted")  # what toggles may share


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import in `graph` that climbs LAYERS, breaks a NEVER rule, is a toggle importing another toggle, or
    a module below the widgets importing them."""
    broken = []
    for name, deps in graph.items():
        if name == ROOT:
            continue
        mine = layer_of(name)
        broken += [f"{name} ({LAYERS[mine][0]}) imports {d} ({LAYERS[layer_of(d)][0]}), a layer above" for d in deps
                   if mine is not None and layer_of(d) is not None and layer_of(d) > mine]
    for layer, never in NEVER:
        for name, deps in graph.items():
            if under(name, layer):
                broken += [f"{name} imports {d}" for d in deps if any(under(d, n) for n in never)
                           and not under(d, layer)]
    for name, deps in graph.items():
        if name != ROOT and not under(name, "scalekit.widgets"):
            broken += [f"{name} imports {d} (nothing below the widgets imports them)" for d in deps
                       if under(d, "scalekit.widgets")]
        if name.startswith("scalekit.toggles.") and name not in TOGGLE_HELPERS:
            broken += [f"{name} imports the toggle {d}" for d in deps
                       if d.startswith("scalekit.toggles.") and d not in TOGGLE_HELPERS]
    return sorted(set(broken))


def test_every_module_has_a_layer():
    unplaced = sorted(name for name in modules() if name != ROOT and layer_of(name) is None)
    assert not unplaced, f"place these in LAYERS (tests/project/test_architecture.py): {unplaced}"
    assert layer_of("scalekit.not_a_module") is None
    assert LAYERS[layer_of("scalekit.inference.engine")][0] == "generation"
    assert LAYERS[layer_of("scalekit.cli.parser")][0] == "interfaces"
    assert LAYERS[layer_of("scalekit.cli.fields")][0] == "foundations"  # the longest prefix places a module
    assert LAYERS[layer_of("scalekit.training.results")][0] == "measure"
    assert LAYERS[layer_of("scalekit.training.finetune")][0] == "runs"  # the package's own layer


def test_imports_only_run_down():
    broken = upward_imports(import_graph())
    assert not broken, "upward or sideways imports: " + "; ".join(broken)


def test_the_import_rules_catch_what_they_forbid():
    assert upward_imports({"scalekit.models.family": {"scalekit.hf.model"}}) == \
        ["scalekit.models.family (models) imports scalekit.hf.model (hf), a layer above",
         "scalekit.models.family imports scalekit.hf.model"]
    assert upward_imports({"scalekit.toggles.dora": {"scalekit.toggles.lora", "scalekit.toggles.base"}}) == \
        ["scalekit.toggles.dora imports the toggle scalekit.toggles.lora"]
    assert upward_imports({"scalekit.training.engine": {"scalekit.widgets.lab"}}) == \
        ["scalekit.training.engine (engine) imports scalekit.widgets.lab (interfaces), a layer above",
         "scalekit.training.engine imports scalekit.widgets.lab",  # training's own rule
         "scalekit.training.engine imports scalekit.widgets.lab (nothing below the widgets imports them)"]
    # a training study (the runs layer, as autotune is) that imports the search breaks training's rule
    assert upward_imports({"scalekit.training.finetune": {"scalekit.autotune.search"}}) == \
        ["scalekit.training.finetune imports scalekit.autotune.search"]
    assert upward_imports({"scalekit.toggles.quantize": {"scalekit.inference.engine"}}) == \
        ["scalekit.toggles.quantize (toggles) imports scalekit.inference.engine (generation), a layer above",
         "scalekit.toggles.quantize imports scalekit.inference.engine"]
    # a toggle imports no run loop: not the engine, training (its build, its evaluator), nor generation's engine
    assert upward_imports({"scalekit.toggles.grad_accum": {"scalekit.training.build"}}) == \
        ["scalekit.toggles.grad_accum (toggles) imports scalekit.training.build (training), a layer above",
         "scalekit.toggles.grad_accum imports scalekit.training.build"]
    # the import that closed the loop hf → training → families → hf: both the layer order and hf's rule see it
    assert upward_imports({"scalekit.hf.callback": {"scalekit.training.build", "scalekit.measure.flops"}}) == \
        ["scalekit.hf.callback (hf) imports scalekit.training.build (training), a layer above",
         "scalekit.hf.callback imports scalekit.training.build"]
    # generation importing training's evaluator: the layer order and generation's own rule
    assert upward_imports({"scalekit.inference.loop": {"scalekit.training.evaluation"}}) == \
        ["scalekit.inference.loop (generation) imports scalekit.training.evaluation (training), a layer above",
         "scalekit.inference.loop imports scalekit.training.evaluation"]
    # a sideways import the layer order allows and a rule forbids (errors imports nothing of scalekit)
    assert upward_imports({"scalekit.errors": {"scalekit.files"}}) == ["scalekit.errors imports scalekit.files"]
    assert upward_imports({"scalekit.measure.flops": {"scalekit.errors"}, "scalekit": {"scalekit.widgets"}}) == []


# Libraries whose import can pull in bitsandbytes, which (with the `kernels` package installed) asks the Hub for a
# CPU kernel as it imports: scalekit imports them only through optional.quiet_import, which keeps the Hub offline.
THROUGH_QUIET_IMPORT = ("transformers", "peft", "bitsandbytes", "hqq", "torchao")


def direct_library_imports(source: str) -> list[str]:
    """`import X` / `from X import ...` of a THROUGH_QUIET_IMPORT library in `source` (TYPE_CHECKING excluded)."""
    tree = ast.parse(source)
    type_only = type_checking_nodes(tree)
    found = []
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names
                      if a.name.split(".")[0] in THROUGH_QUIET_IMPORT]
        elif isinstance(node, ast.ImportFrom) and not node.level \
                and (node.module or "").split(".")[0] in THROUGH_QUIET_IMPORT:
            found.append(f"line {node.lineno}: from {node.module} import ...")
    return found


def test_the_libraries_that_reach_for_the_hub_are_imported_only_through_quiet_import():
    broken = {str(p.relative_to(PACKAGE)): found for p in sorted(PACKAGE.rglob("*.py"))
              if (found := direct_library_imports(p.read_text(encoding="utf-8")))}
    assert not broken, f"import these through scalekit.optional.quiet_import: {broken}"
    assert direct_library_imports("def f():\n    from transformers import TrainerCallback\n    import peft.tuners\n") \
        == ["line 2: from transformers import ...", "line 3: import peft.tuners"]
    assert direct_library_imports("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import peft\n") == []


# -- the build context and the toggles' attributes --------------------------------------------------------
CONTEXT_FIELDS = {f.name for f in dataclasses.fields(BuildContext)}


def attribute_uses(path: Path, variable: str = "ctx") -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name) and node.value.id == variable}


def test_build_context_refuses_an_undeclared_field():
    with built(tiny()) as ctx:
        with pytest.raises(AttributeError):
            ctx.not_a_field = 1


@pytest.mark.parametrize("path", sorted([*(PACKAGE / "toggles").glob("*.py"), PACKAGE / "training" / "engine.py",
                                         PACKAGE / "training" / "build.py", PACKAGE / "training" / "evaluation.py",
                                         PACKAGE / "distributed" / "runtime.py"]),
                         ids=lambda p: p.name)
def test_every_context_attribute_the_engine_and_toggles_use_is_declared(path):
    used = attribute_uses(path)
    assert used <= CONTEXT_FIELDS, f"{path.name} uses undeclared BuildContext fields: {sorted(used - CONTEXT_FIELDS)}"


def test_every_context_field_says_what_it_is():
    source = (PACKAGE / "toggles" / "base.py").read_text(encoding="utf-8")
    body = source[source.index("class BuildContext"):source.index("class Toggle:")]
    for name in CONTEXT_FIELDS:
        line = next(line for line in body.splitlines() if line.strip().startswith(f"{name}:"))
        assert "#" in line, f"BuildContext.{name} has no comment"


def test_toggle_attributes_are_declared_and_read_directly():
    for t in ORDER:
        # declared by Toggle, or by the base class it refines (CountToggle's default and unit)
        declared = {n for c in type(t).__mro__[1:] for n in vars(c) if not n.startswith("_")}
        extra = {n for n in vars(type(t)) if not n.startswith("_") and not callable(getattr(type(t), n))
                 and not isinstance(getattr(type(t), n), property)} - declared
        assert not extra, f"{t.name} sets attributes Toggle does not declare: {extra}"
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert 'getattr(toggle' not in text and 'getattr(TOGGLES' not in text, path


def name_tests(path: Path, allowed: set[str]) -> list[str]:
    """`"name" in ...` comparisons against toggle names other than `allowed`."""
    names = set(TOGGLES) - allowed
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            if {n.value for n in ast.walk(node) if isinstance(n, ast.Constant)} & names:
                out.append(ast.unparse(node))
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "get" and node.args \
                and isinstance(node.args[0], ast.Constant) and node.args[0].value in names:
            out.append(ast.unparse(node))
    return out


def test_toggles_and_the_engine_never_test_toggle_names():
    for path in (PACKAGE / "toggles").glob("*.py"):
        if path.name == "__init__.py":
            continue  # the order, the exclusive and required pairs are written there, by name
        assert not name_tests(path, {path.stem}), f"{path.name} tests another toggle's name"
    for path in (PACKAGE / "training" / "engine.py", PACKAGE / "training" / "build.py",
                 PACKAGE / "training" / "evaluation.py", PACKAGE / "distributed" / "runtime.py"):
        assert not name_tests(path, set()), f"{path.name} tests a toggle's name: {name_tests(path, set())}"


def test_build_walks_the_phases_in_their_one_order(monkeypatch):
    seen = []
    original = training.apply_toggles
    monkeypatch.setattr(training, "apply_toggles", lambda ctx, phase, toggles: (seen.append(phase),
                                                                                 original(ctx, phase, toggles)))
    with contextlib.ExitStack() as stack:
        training.build(tiny().resolve(CPU), CPU, stack)
    assert tuple(seen) == PHASES
    assert set(training.BUILDERS) <= set(PHASES)
    assert [PHASES.index(t.phase) for t in ORDER] == sorted(PHASES.index(t.phase) for t in ORDER)


def test_precision_toggles_set_the_context_fields_wrappers_read():
    with built(tiny(toggles=["bf16"])) as ctx:
        assert ctx.compute_dtype == ctx.wrapper_param_dtype == torch.bfloat16
        assert flops.mfu_dtype(ctx.compute_dtype, ctx.tf32_matmuls) == "bf16"
    with built(tiny(toggles=["fp16"])) as ctx:
        assert ctx.compute_dtype == torch.float16 and ctx.wrapper_param_dtype is None
        assert ctx.stepper.grad_scaler is ctx.grad_scaler is not None
    with built(tiny()) as ctx:
        assert ctx.compute_dtype is None and not ctx.compiled
        assert flops.mfu_dtype(ctx.compute_dtype, ctx.tf32_matmuls) == "fp32"


# -- one rule for the blocks --------------------------------------------------------------------------------
class TwoContainers(torch.nn.Module):
    """Blocks in an nn.Sequential and a small nn.ModuleList of heads: the rules of checkpointing (largest
    container) and FSDP (every ModuleList's members) used to pick different modules here."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh())
                                          for _ in range(3)])
        self.heads = torch.nn.ModuleList([torch.nn.Linear(32, 1), torch.nn.Linear(32, 1)])

    def forward(self, x):
        h = self.body(x)
        return sum(head(h) for head in self.heads).squeeze(-1)


def two_containers_batch(batch_size, device):
    x = torch.randn(batch_size, 32, device=device)
    return x, x.mean(-1)


def mse(model, batch):
    return torch.nn.functional.mse_loss(model(batch[0]), batch[1])


def test_one_rule_decides_the_blocks_for_checkpointing_and_fsdp(monkeypatch):
    import scalekit.toggles.fsdp as fsdp_module

    model = TwoContainers()
    assert find_blocks(model) is model.body  # the blocks, not the heads
    cfg = dict(model=TwoContainers, batch_fn=two_containers_batch, loss_fn=mse, batch_size=4)
    with built(tiny(toggles={"checkpointing": 1}, **cfg)) as ctx:
        assert ctx.blocks is not None and [type(b) for b in ctx.blocks] == [torch.nn.Sequential] * 3
        checkpointed = [b for b in ctx.blocks if "forward" in vars(b)]  # the toggle wraps block.forward
        assert len(checkpointed) == 3
        sharded = []
        import torch.distributed.fsdp as torch_fsdp  # the toggle imports fully_shard from it when it applies

        monkeypatch.setattr(torch_fsdp, "fully_shard", lambda module, **kw: sharded.append(module))
        monkeypatch.setattr(fsdp_module, "init_device_mesh", lambda *a: None)
        TOGGLES["fsdp"].apply(ctx, True)
        assert sharded[:-1] == list(ctx.blocks) and sharded[-1] is ctx.base_model  # the same blocks, then the root


def test_the_block_rule_covers_the_model_families():
    from scalekit.models import GPT, PRESETS

    gpt = GPT(PRESETS["tiny"].gpt_config())
    assert find_blocks(gpt) is gpt.transformer.h
    assert find_blocks(torch.compile(gpt)) is gpt.transformer.h  # through the compile wrapper

    class Llama(torch.nn.Module):  # HF-style: model.layers
        def __init__(self):
            super().__init__()
            self.model = torch.nn.Module()
            self.model.embed = torch.nn.Embedding(10, 8)
            self.model.layers = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(2)])

    class Bert(torch.nn.Module):  # HF-style: encoder.layer
        def __init__(self):
            super().__init__()
            self.encoder = torch.nn.Module()
            self.encoder.layer = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(2)])

    llama, bert = Llama(), Bert()
    assert find_blocks(llama) is llama.model.layers and find_blocks(bert) is bert.encoder.layer
    assert find_blocks(torch.nn.Linear(3, 3)) is None


# -- short functions --------------------------------------------------------------------------------------
def test_no_function_in_scalekit_is_longer_than_about_50_lines():
    long = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "split these into named steps: " + "; ".join(long)


# -- toggles show their code --------------------------------------------------------------------------------
def test_a_toggle_shows_the_code_it_runs():
    assert "torch.compile(ctx.model, mode=value)" in TOGGLES["compile"].code()
    code = TOGGLES["checkpointing"].code()
    assert "def checkpoint_every" in code and "use_reentrant=False" in code  # helpers it calls, too
    for t in ORDER:
        assert "def apply(self, ctx" in t.code(), t.name


def test_the_modules_loose_at_the_top_are_few_and_are_foundations():
    loose = sorted(p.stem for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(loose) < 12, f"group these into packages by job: {loose}"
    assert all(LAYERS[layer_of(f"scalekit.{name}")][0] == "foundations" for name in loose), loose
