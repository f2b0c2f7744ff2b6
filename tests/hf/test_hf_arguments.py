"""TrainingArguments in and out, and the code exported for Transformers, Accelerate and Lightning."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

transformers = pytest.importorskip("transformers", reason="the Transformers bridge needs transformers installed")

from scalekit import ConfigError, RunConfig  # noqa: E402
from scalekit.cli.main import main  # noqa: E402
from scalekit.hf import arguments as hf_args  # noqa: E402
from scalekit.hf.export import export_code  # noqa: E402
from scalekit.toggles import TOGGLES, Toggle, needs_process_group, register, unregister  # noqa: E402
from scalekit.toggles.base import EXPORT_TARGETS, Call, Spelling  # noqa: E402
from scalekit.toggles.compile import COMPILE_MODES  # noqa: E402

# transformers.TrainingArguments is looked up when a test runs, not at collection: importing it imports peft and so
# bitsandbytes, after which scalekit.launch (rightly) refuses to fork the ranks that the forking tests, run first, start


def test_the_defaults_assumed_for_a_dict_are_the_installed_transformers_defaults():
    fields = {f.name: f.default for f in dataclasses.fields(transformers.TrainingArguments) if f.init}
    for name, default in hf_args.DEFAULTS.items():
        assert name in fields, f"TrainingArguments has no field {name!r}"
        assert fields[name] == default, (name, fields[name], default)


def test_a_real_training_arguments_maps_field_by_field(tmp_path):
    args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, gradient_accumulation_steps=2,
                             activation_checkpointing=True, use_cpu=True, bf16=True, optim="adamw_bnb_8bit",
                             torch_compile_mode="reduce-overhead", torch_empty_cache_steps=5, dataloader_drop_last=True,
                             learning_rate=3e-4, seed=7, weight_decay=0.1, warmup_steps=10)
    cfg = RunConfig.from_training_arguments(args)
    assert cfg.toggles == {"bf16": True, "drop_last": True, "optim": "adamw_bnb_8bit", "checkpointing": 1,
                           "compile": "reduce-overhead", "grad_accum": 2, "empty_cache_steps": 5}
    assert (cfg.batch_size, cfg.lr, cfg.seed, cfg.device) == (8, 3e-4, 7, "cpu")
    notes = " ".join(cfg.notes)
    assert "weight_decay=0.1" in notes and "warmup_steps=10" in notes  # set, not mapped: said with the value
    assert "adam_beta1" in notes and "max_grad_norm" in notes  # at their defaults, not mapped: named
    for f in dataclasses.fields(transformers.TrainingArguments):
        if f.init and f.name not in hf_args.MAPPED:
            assert f.name in notes, f"{f.name} is neither mapped nor listed"


class PersistentWorkers(Toggle):
    """A toggle the registry does not have: it declares its TrainingArguments field and its spellings, nothing else."""

    name, summary, group, phase = "persistent_workers", "DataLoader workers kept from one epoch to the next", "data", "data"
    training_fields = {"dataloader_persistent_workers": False}

    def from_training_arguments(self, fields, notes):
        return fields["dataloader_persistent_workers"] or None

    def spelling(self, target, value, cfg):
        return Spelling(kwargs={"dataloader_persistent_workers": True}) if target == "hf" else \
            Spelling(loader={"persistent_workers": "True"})

    def off_spelling(self, target, cfg):
        return Spelling(kwargs={"dataloader_persistent_workers": False}) if target == "hf" else Spelling()

    def apply(self, ctx, value):
        ctx.loader_kwargs["persistent_workers"] = True


def test_a_toggle_maps_its_own_training_arguments_fields_once_registered():
    fields, notes = hf_args.run_config_fields({"dataloader_num_workers": 4})
    assert fields["toggles"]["dataloader_num_workers"] == 4 and not any("dataloader_num_workers" in n for n in notes)
    assert hf_args.training_arguments(RunConfig(batch_size=8))["dataloader_num_workers"] == 0  # what "off" writes
    given_ = {"dataloader_persistent_workers": True}
    _, notes = hf_args.run_config_fields(given_)  # no toggle reads it yet: listed as not mapped, with its value
    assert any("not mapped" in n and "dataloader_persistent_workers=True" in n for n in notes)
    register(PersistentWorkers())  # the toggle's own declarations map it, with no change to scalekit.hf
    try:
        assert hf_args.DEFAULTS["dataloader_persistent_workers"] is False
        fields, notes = hf_args.run_config_fields(given_)
        assert fields["toggles"]["persistent_workers"] is True
        assert not any("dataloader_persistent_workers" in n for n in notes)
        assert hf_args.training_arguments(RunConfig(batch_size=8))["dataloader_persistent_workers"] is False
        cfg = RunConfig(batch_size=8, toggles=["persistent_workers"], device="cpu")
        assert hf_args.training_arguments(cfg)["dataloader_persistent_workers"] is True
        assert "shuffle=True, persistent_workers=True)" in export_code(cfg, "accelerate")
    finally:
        unregister("persistent_workers")
    assert "dataloader_persistent_workers" not in hf_args.MAPPED


def test_unsupported_values_are_said_or_refused_naming_the_field():
    _, notes = hf_args.run_config_fields({"optim": "sgd"})
    assert any("optim='sgd' not mapped" in n for n in notes)
    _, notes = hf_args.run_config_fields({"torch_compile": True, "torch_compile_backend": "aot_eager"})
    assert any("torch_compile_backend='aot_eager' not mapped" in n for n in notes)
    with pytest.raises(ConfigError, match="TrainingArguments.torch_compile_mode='fast'.*max-autotune"):
        RunConfig.from_training_arguments({"torch_compile_mode": "fast"})
    with pytest.raises(ConfigError, match="from_training_arguments takes a transformers.TrainingArguments"):
        RunConfig.from_training_arguments(42)
    with pytest.raises(ConfigError, match="batch_size=12 must be divisible by grad_accum × world_size = 8 × 1"):
        RunConfig(batch_size=12, toggles={"grad_accum": 8}).to_training_arguments()


def test_world_size_multiplies_the_per_device_batch_and_means_ddp():
    cfg = RunConfig.from_training_arguments({"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2},
                                            world_size=2)
    # transformers.TrainingArguments' default optimizer is fused AdamW: a dict that leaves it out means that one
    assert cfg.batch_size == 16 and cfg.toggles == {"ddp": True, "grad_accum": 2, "optim": "adamw_torch_fused"}
    fsdp = RunConfig.from_training_arguments({"fsdp": "full_shard offload auto_wrap", "optim": "adamw_torch"},
                                             world_size=4)
    assert fsdp.toggles == {"cpu_offload": True, "fsdp": True} and fsdp.batch_size == 32


def test_an_export_divides_the_batch_over_the_data_parallel_ranks_only():
    # transformers' Trainer gives the ranks of a tensor-parallel group the same rows (world_size / tp_size shards)
    per_device = [hf_args.per_device_batch(RunConfig(toggles=toggles, batch_size=8), world)
                  for toggles, world in ((["ddp"], 2), ({"tensor_parallel": 2}, 2), ({"fsdp": True, "tensor_parallel": 2}, 4))]
    assert per_device == [4, 8, 4]
    assert "per_device_train_batch_size=8," in export_code(RunConfig(toggles={"tensor_parallel": 2}, batch_size=8),
                                                           "hf", world_size=2)
    with pytest.raises(ConfigError, match="batch_size=6 must be divisible by grad_accum × data-parallel ranks = 1 × 4"):
        hf_args.per_device_batch(RunConfig(toggles={"fsdp": True, "tensor_parallel": 2}, batch_size=6), 8)


def test_the_spellings_that_share_one_training_arguments_value_build_the_same_optimizer():
    from tests.helpers import built

    for alias, canonical in ((["fused_adamw"], {"optim": "adamw_torch_fused"}), ({"optim": "adamw_torch"}, {})):
        back = RunConfig.from_training_arguments(RunConfig(toggles=alias, batch_size=8).to_training_arguments())
        assert back.toggles == canonical
        with built(RunConfig(preset="tiny", toggles=alias)) as a, built(RunConfig(preset="tiny", toggles=canonical)) as b:
            assert type(a.optimizer) is type(b.optimizer)
            assert a.optimizer.defaults == b.optimizer.defaults


# -- the round trip, over the toggles ------------------------------------------------------------------------
SPREADS = [{}, {"ddp": True}, {"fsdp": True}, {"fsdp": True, "cpu_offload": True},
           *({"deepspeed": m} for m in TOGGLES["deepspeed"].choices)]
OPTIMS = [None, "adamw_torch_fused", "adamw_bnb_8bit", "paged_adamw_8bit", "lion_8bit", "adafactor"]


@st.composite
def mapped_configs(draw):
    toggles: dict = {}
    precision = draw(st.sampled_from([None, "bf16", "fp16"]))
    if precision:
        toggles[precision] = True
    if draw(st.booleans()):
        toggles["tf32"] = True
    k = draw(st.sampled_from([1, 2, 4]))
    if k > 1:
        toggles["grad_accum"] = k
    for name, values in (("checkpointing", [None, 1, 2, 3]), ("optim", OPTIMS), ("compile", [None, *COMPILE_MODES]),
                         ("empty_cache_steps", [None, 1, 10]), ("drop_last", [None, True])):
        value = draw(st.sampled_from(values))
        if value is not None:
            toggles[name] = value
    spread = draw(st.sampled_from(SPREADS))
    assume(not ("deepspeed" in spread and "fp16" in toggles))  # RunConfig refuses that pair
    toggles.update(spread)
    world = draw(st.sampled_from([2, 4])) if spread else 1
    batch = draw(st.integers(1, 8)) * k * world
    return RunConfig(toggles=toggles, batch_size=batch, lr=draw(st.floats(1e-6, 1e-1)), seed=draw(st.integers(0, 2**31)),
                     device=draw(st.sampled_from(["auto", "cpu"]))), world


@pytest.mark.filterwarnings("ignore:to_training_arguments:UserWarning")  # adafactor's caveat, said each time
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mapped_configs())
def test_from_training_arguments_of_to_training_arguments_gives_back_the_config(case):
    cfg, world = case
    kwargs = cfg.to_training_arguments(world_size=world)
    back = RunConfig.from_training_arguments(kwargs, world_size=world)
    assert back == cfg, (kwargs, back.toggles, cfg.toggles)


# -- exported code ---------------------------------------------------------------------------------------------
def tiny_dataset(n: int, seq: int = 16) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    return [{"input_ids": (x := torch.randint(0, 65, (seq,), generator=g)), "labels": x} for _ in range(n)]


@pytest.mark.parametrize("toggles", [{}, {"bf16": True, "grad_accum": 2, "checkpointing": 1},
                                     {"sdpa": True, "nice_numbers": True, "optim": "adamw_bnb_8bit"},
                                     {"compile": "max-autotune", "fp16": True, "empty_cache_steps": 3},
                                     {"fsdp": True, "cpu_offload": True, "grad_accum": 2}],
                         ids=["baseline", "bf16-accum-ckpt", "sdpa-nice-8bit", "compile-fp16-empty", "fsdp"])
def test_exported_transformers_code_builds_the_same_training_arguments(toggles, tmp_path, monkeypatch):
    from scalekit.hf import model_config

    monkeypatch.chdir(tmp_path)  # the Trainer makes its output_dir in the working directory
    world = 2 if "fsdp" in toggles else 1
    cfg = RunConfig(toggles=toggles, batch_size=8, lr=2e-3, seed=3, device="cpu")
    code = export_code(cfg, "hf", world_size=world)
    runs = "compile" not in toggles and world == 1  # it trains (compiling on a CPU takes a minute: not here)
    if not runs:
        code = code[:code.index("trainer = Trainer(")]
    namespace = {"config": model_config("gpt2", "tiny"), "train_dataset": tiny_dataset(8)}
    exec(compile(code, "exported.py", "exec"), namespace)
    args = namespace["args"]
    assert isinstance(args, transformers.TrainingArguments)
    # what transformers.TrainingArguments carries comes back; the model-side toggles are in the model the code built
    training_side = {n: v for n, v in cfg.toggles.items() if n not in hf_args.model_side(cfg)}
    assert RunConfig.from_training_arguments(args, world_size=world) == dataclasses.replace(cfg, toggles=training_side)
    model = namespace["model"]
    assert model.config._attn_implementation == ("sdpa" if "sdpa" in toggles else "eager")
    assert model.config.vocab_size == (128 if "nice_numbers" in toggles else 65)
    if runs:
        assert namespace["trainer"].state.global_step == 3  # 8 samples, one step an epoch, three epochs


@pytest.mark.gpu
def test_exported_tf32_code_builds_its_training_arguments_on_a_gpu():
    cfg = RunConfig(toggles={"tf32": True, "bf16": True}, batch_size=8)
    code = export_code(cfg, "hf")
    namespace = {"TrainingArguments": transformers.TrainingArguments}
    exec(code[code.index("args = "):code.index("trainer = Trainer(")], namespace)
    assert RunConfig.from_training_arguments(namespace["args"]) == cfg


ACCELERATE_RUN = """
import sys, torch, accelerate
from torch.optim.optimizer import register_optimizer_step_post_hook
from scalekit.hf import model_config
seen = []
original = accelerate.Accelerator.__init__
def recording(self, *args, **kwargs):
    original(self, *args, **kwargs)
    seen.append(self)
accelerate.Accelerator.__init__ = recording
updates = []
register_optimizer_step_post_hook(lambda *a: updates.append(1))
g = torch.Generator().manual_seed(0)
train_dataset = [{"input_ids": (x := torch.randint(0, 65, (16,), generator=g)), "labels": x} for _ in range(16)]
config = model_config("gpt2", "tiny")
exec(sys.stdin.read())
a = seen[0]
print(a.mixed_precision, a.gradient_accumulation_steps, a.device.type, len(updates))
"""


@pytest.mark.parametrize("toggles,expected", [({"bf16": True, "grad_accum": 4, "checkpointing": 1}, "bf16 4 cpu"),
                                              ({"optim": "lion_8bit", "sdpa": True}, "no 1 cpu")])
def test_exported_accelerate_code_runs_and_sets_up_the_accelerator(toggles, expected):
    code = export_code(RunConfig(toggles=toggles, batch_size=8, device="cpu"), "accelerate")
    proc = subprocess.run([sys.executable, "-c", ACCELERATE_RUN], input=code, capture_output=True, text=True,
                          timeout=300, env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    precision, k, device, steps = proc.stdout.split()[-4:]
    assert f"{precision} {k} {device}" == expected
    assert int(steps) == 2  # 16 samples, batch_size=8 per optimizer step: two updates, with or without accumulation


def trainer_keywords(code: str) -> dict:
    """The keyword arguments of the L.Trainer(...) call in `code`, as source text."""
    call = next(n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Call) and ast.unparse(n.func) == "L.Trainer")
    return {k.arg: ast.unparse(k.value) for k in call.keywords}


@pytest.mark.parametrize("toggles,world,expected", [
    ({"bf16": True, "grad_accum": 4}, 1, {"precision": "'bf16-mixed'", "accumulate_grad_batches": "4", "devices": "1"}),
    ({"fp16": True, "ddp": True}, 2, {"precision": "'16-mixed'", "strategy": "'ddp'", "devices": "2"}),
    ({"fsdp": True, "cpu_offload": True}, 4, {"strategy": "FSDPStrategy(cpu_offload=True)", "devices": "4"}),
    ({"deepspeed": "zero3-offload"}, 2, {"strategy": "'deepspeed_stage_3_offload'", "precision": "'32-true'"}),
])
def test_exported_lightning_code_sets_the_trainer(toggles, world, expected):
    code = export_code(RunConfig(toggles=toggles, batch_size=16), "lightning", world_size=world)
    compile(code, "lightning.py", "exec")  # valid Python (Lightning itself is not installed here)
    keywords = trainer_keywords(code)
    assert {k: keywords[k] for k in expected} == expected
    if "fsdp" in toggles:
        assert "FSDP1" in code  # says that Lightning's FSDPStrategy is not FSDP2


def test_exported_code_carries_what_the_trainer_arguments_cannot():
    cfg = RunConfig(toggles={"checkpointing": 2, "compile": "default", "tf32": True, "empty_cache_steps": 10,
                             "optim": "adam_bnb_8bit"}, batch_size=8)
    lightning = export_code(cfg, "lightning")
    assert "every_n_layers=2" in lightning and "torch.compile(self.model, mode='default')" in lightning
    assert 'set_float32_matmul_precision("high")' in lightning and "torch.cuda.empty_cache()" in lightning
    assert "bnb.optim.Adam8bit(self.parameters(), lr=0.001)" in lightning
    hf = export_code(dataclasses.replace(cfg, toggles={"checkpointing": "sequential"}), "hf")
    assert "# not carried: checkpointing='sequential': has no TrainingArguments field" in hf
    with pytest.warns(UserWarning, match="optim='adam_bnb_8bit' → 'adamw_bnb_8bit'"):
        assert cfg.to_training_arguments()["weight_decay"] == 0.0  # Adam8bit: AdamW8bit without decay
    with pytest.raises(ConfigError, match="unknown target 'keras'; allowed: hf, accelerate, lightning"):
        export_code(cfg, "keras")


def test_cli_export_prints_the_code(capsys):
    assert main(["export", "hf", "--toggle", "bf16", "--toggle", "grad_accum=2", "--batch-size", "16",
                 "--device", "cpu", "--lr", "0.0003"]) == 0
    out = capsys.readouterr().out
    assert "gradient_accumulation_steps=2" in out and "per_device_train_batch_size=8" in out
    assert "bf16=True" in out and "learning_rate=0.0003" in out and "use_cpu=True" in out
    assert main(["export", "accelerate", "--toggle", "ddp", "--world-size", "2", "--batch-size", "8"]) == 0
    assert "notebook_launcher(training_function, num_processes=2)" in capsys.readouterr().out
    assert main(["export", "lightning", "--toggle", "grad_accum=3", "--batch-size", "8"]) == 2
    assert "--batch-size" in capsys.readouterr().err


def test_the_argument_and_export_modules_do_not_import_transformers():
    code = textwrap.dedent("""
        import sys
        import scalekit.hf.arguments, scalekit.hf.export
        print('transformers' in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-2000:]


def test_data_loader_fields_map_to_the_data_toggles_and_pinning_only_where_there_is_a_gpu():
    cfg = RunConfig.from_training_arguments({"dataloader_num_workers": 3, "dataloader_drop_last": True,
                                             "dataloader_pin_memory": True, "optim": "adamw_torch"})
    expected = {"dataloader_num_workers": 3, "drop_last": True}
    if torch.cuda.is_available():
        expected["dataloader_pin_memory"] = True
    else:  # the Trainer pins nothing on a CPU; scalekit's toggle would be refused: said, not switched on
        assert any(n.startswith("dataloader_pin_memory=True: the Trainer pins batches only on a GPU") for n in cfg.notes)
    assert cfg.toggles == expected
    assert RunConfig.from_training_arguments({"dataloader_pin_memory": False, "optim": "adamw_torch"}).toggles == {}


# -- every toggle, every framework: carried, or listed with why ---------------------------------------------------
def on_alone(name: str) -> tuple[RunConfig | None, int]:
    """A training RunConfig with toggle `name` on at its default (and the first toggle it needs), and the processes it
    runs in; None for a toggle no training config can hold (it replaces the weights of the model being trained)."""
    toggle = TOGGLES[name]
    toggles = {**{need: True for need in toggle.requires[:1]}, name: True}
    try:
        cfg = RunConfig(toggles=toggles, batch_size=8, device="cpu", eval_every=0 if "train" in toggle.loops else 5)
    except ConfigError:
        assert toggle.changes_weights, name
        return None, 1
    return cfg, 2 if needs_process_group(cfg.toggles) else 1


def unwritten(spelled: Spelling, code: str, target: str) -> list[str]:
    """The pieces of `spelled` that `code` does not hold; a keyword argument merged with another toggle's (a dict, a
    Call) is looked for key by key.  TrainingArguments' values are Python values, the other targets' source text."""
    pieces = [*spelled.imports, *spelled.setup, *spelled.model, *spelled.wrap, *spelled.after_step,
              *(f"{k}={v}" for k, v in spelled.model_kwargs.items()), *(f"{k}={v}" for k, v in spelled.loader.items()),
              *([spelled.optimizer] if spelled.optimizer else []), *(f"# note: {n}" for n in spelled.notes)]
    for key, value in spelled.kwargs.items():
        if isinstance(value, dict):
            pieces += [f"{key}=", *(f"{k!r}: {v!r}" for k, v in value.items())]
        elif isinstance(value, Call):
            pieces += [f"{key}={value.name}(", *(f"{k}={v}" for k, v in value.kwargs.items())]
        else:
            pieces.append(f"{key}={value!r}" if target == "hf" else f"{key}={value}")
    assert pieces, "a spelling that carries a toggle writes something"
    return [p for p in pieces if p not in code]


@pytest.mark.parametrize("target", EXPORT_TARGETS)
@pytest.mark.parametrize("name", list(TOGGLES))
def test_every_toggle_is_carried_or_listed_with_why_by_every_export(name, target):
    cfg, world = on_alone(name)
    value = TOGGLES[name].validate(True)
    if cfg is None:  # nothing to export; still, asked, it says why no training code carries it
        assert TOGGLES[name].spelling(target, value, RunConfig()).missing
        return
    code = export_code(cfg, target, world_size=world)
    compile(code, f"{target}.py", "exec")
    spelled = TOGGLES[name].spelling(target, value, cfg)
    if spelled.missing:
        assert f"# not carried: {hf_args.label(name, value)}: {spelled.missing}" in code
    elif spelled.gpu_only and not torch.cuda.is_available():  # refused here: left out of code that is to run here
        assert f"# not carried: {hf_args.label(name, value)}: refused where there is no GPU" in code
    else:
        assert not unwritten(spelled, code, target), (unwritten(spelled, code, target), code)
    if target == "hf":  # to_training_arguments: as arguments, or named in its warning (with why)
        kwargs, notes = hf_args.training_arguments_and_notes(cfg, world)
        hf = TOGGLES[name].spelling("hf", value, cfg)
        assert set(hf.kwargs) <= set(kwargs) and (hf.kwargs or any(n.startswith(hf_args.label(name, value)) or
                                                                   f"not carried: {hf_args.label(name, value)}:" in n
                                                                   for n in notes)), (kwargs, notes)


def test_an_export_carries_adapters_a_quantized_base_and_a_new_head_and_lists_what_it_cannot(capsys):
    assert main(["export", "hf", "--toggle", "lora=8", "--toggle", "quantized_base=nf4"]) == 0
    out = capsys.readouterr().out
    assert "LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=\"all-linear\", use_dora=False" in out
    assert "get_peft_model(model, adapters)" in out and "fan_in_fan_out=any(isinstance(m, Conv1D)" in out
    assert 'BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")' in out
    for target in EXPORT_TARGETS:
        dora = export_code(RunConfig(toggles={"dora": 4, "data_echo": 2}, batch_size=8), target)
        assert "LoraConfig(r=4, lora_alpha=8" in dora and "use_dora=True" in dora
        assert "# not carried: data_echo=2: no framework has a switch" in dora
        head = export_code(RunConfig(toggles=["head_only"], adapter_targets=["c_attn"], batch_size=8), target)
        assert "p.requires_grad_(False)" in head and "model.set_output_embeddings(copy.deepcopy(" in head
    targeted = export_code(RunConfig(toggles={"lora": 16}, adapter_targets=["c_attn"]), "accelerate")
    assert "target_modules=['c_attn']" in targeted
    with pytest.warns(UserWarning, match=r"not carried: lora=8: model-side in Transformers \(adapters = LoraConfig") as said:
        kwargs = RunConfig(toggles={"lora": 8, "quantized_base": "nf4", "data_echo": 2}, batch_size=8).to_training_arguments()
    assert "not carried: data_echo=2: no framework has a switch" in str(said[0].message)
    assert "not carried: quantized_base='nf4': model-side in Transformers" in str(said[0].message)
    assert RunConfig.from_training_arguments(kwargs).batch_size == 8


# -- every field read, every kind of value: accepted, or refused naming the field ----------------------------------
ANY_VALUE = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True) |
                         st.text(max_size=12) | st.sampled_from(["offload", "full_shard offload", "inductor", "adafactor",
                                                                 "max-autotune", "adamw_torch", "8", "-1", ""]),
                         lambda inner: st.lists(inner, max_size=3) |
                         st.dictionaries(st.sampled_from(["every_n_layers", "use_reentrant", "version", "cpu_offload",
                                                          "zero_optimization", "stage", "non_blocking", "x"]),
                                         inner, max_size=3), max_leaves=6)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(sorted(hf_args.RUN_FIELDS.keys() | {f for t in TOGGLES.values() for f in t.training_fields})),
       value=ANY_VALUE, world=st.sampled_from([1, 2]))
def test_every_field_read_takes_a_value_or_refuses_it_naming_the_field(field, value, world):
    try:
        cfg = RunConfig.from_training_arguments({field: value}, world_size=world)
    except ConfigError as exc:
        assert "TrainingArguments" in str(exc) and field in str(exc), (field, value, str(exc))
    else:
        assert isinstance(cfg, RunConfig)


def test_a_field_of_the_wrong_kind_is_refused_naming_it_and_what_it_allows():
    with pytest.raises(ConfigError, match=r"TrainingArguments.per_device_train_batch_size must be a positive integer "
                                          r"from 1 to 16,777,216, got 'eight'"):
        RunConfig.from_training_arguments({"per_device_train_batch_size": "eight"})
    for field, value, allowed in (("bf16", "yes", "True or False"), ("tf32", 1, "True, False or None"),
                                  ("learning_rate", 2.0, "a number from 1e-08 to 1"),
                                  ("gradient_accumulation_steps", 0, "a positive integer"),
                                  ("optim", 3, "an optimizer's name"), ("fsdp", 3, "None, True, or FSDP options"),
                                  ("activation_checkpointing_kwargs", [1], "a dict"), ("deepspeed", 3, "a dict")):
        with pytest.raises(ConfigError, match=f"TrainingArguments.{field} must be {allowed}"):
            RunConfig.from_training_arguments({field: value})
    with pytest.raises(ConfigError, match=r"TrainingArguments.activation_checkpointing_kwargs\['every_n_layers'\] must"):
        RunConfig.from_training_arguments({"activation_checkpointing": True, "activation_checkpointing_kwargs":
                                           {"every_n_layers": "2"}})
