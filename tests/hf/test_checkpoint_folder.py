"""A checkpoint folder on disk wherever a model is named: RunConfig(model=PATH), GenerateConfig(model=PATH),
Lab(model=PATH) and `--hf-model PATH`.  The folders are written here (tests/own_files.py: GPT-2, Llama and Qwen2
saved with save_pretrained, a BPE tokenizer beside each) and read back: the same logits and greedy tokens as the
model transformers loads from the folder itself, fine-tuning from its weights, every refusal before any weight
is read, and no connection attempted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

import scalekit  # noqa: E402
from scalekit import ConfigError, RunConfig  # noqa: E402
from scalekit.cli.main import main  # noqa: E402
from scalekit.hf.checkpoint_folder import HFCheckpoint  # noqa: E402
from scalekit.inference import GenerateConfig, generate  # noqa: E402
from scalekit.machine.memory_limit import MemoryLimit  # noqa: E402
from scalekit.training.build import train_step  # noqa: E402
from tests.helpers import built, library_lines, one_thread  # noqa: E402
from tests.own_files import CHECKPOINT_FAMILIES, save_checkpoint  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
QUICK = dict(measure_memory=False, quality=False, warmup_tokens=0, device="cpu")
PROMPT = "ROMEO: the king is"


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """One checkpoint folder per family, written once for the module."""
    root = tmp_path_factory.mktemp("checkpoints")
    return {family: save_checkpoint(family, root / family, seed=1) for family in CHECKPOINT_FAMILIES}


def reference(folder):
    """The folder's model as transformers loads it itself (eager attention, as scalekit builds without sdpa)."""
    return transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def some_ids(folder):
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    rows = [tok.encode(PROMPT), tok.encode("JULIET: and so, my lord")]
    return torch.tensor([row[:8] for row in rows])


# -- training: the folder's weights, every toggle's switch ---------------------------------------------------------
@pytest.mark.parametrize("family", CHECKPOINT_FAMILIES)
def test_a_run_builds_the_folders_model_with_its_weights(folders, family):
    cfg = RunConfig(model=str(folders[family]), device="cpu")
    assert isinstance(cfg.model, HFCheckpoint) and cfg.to_dict()["model"] == str(folders[family])
    ids = some_ids(folders[family])
    with built(cfg) as ctx:
        assert ctx.base_model.config._attn_implementation == "eager"
        assert torch.equal(logits(ctx.base_model.eval(), ids), logits(reference(folders[family]), ids))


def test_the_toggles_reach_the_folders_model_as_they_reach_one_built_from_a_config(folders):
    folder = folders["llama"]
    toggles = {"sdpa": True, "nice_numbers": True, "checkpointing": 1}
    with built(RunConfig(model=str(folder), device="cpu", toggles=toggles)) as ctx:
        model = ctx.base_model
        checkpointing = getattr(model, "is_activation_checkpointing", None)  # older transformers: the old name
        assert model.config._attn_implementation == "sdpa"
        assert checkpointing if checkpointing is not None else model.is_gradient_checkpointing
        assert model.get_input_embeddings().weight.shape[0] % 64 == 0
        ids = some_ids(folder)
        ref = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa").eval()
        torch.testing.assert_close(logits(model.eval(), ids)[..., :320], logits(ref, ids), rtol=0, atol=1e-5)


def test_lora_on_a_folder_starts_from_its_logits_and_trains_the_adapters_only(folders):
    folder = folders["qwen2"]
    ids = some_ids(folder)
    with built(RunConfig(model=str(folder), device="cpu", toggles={"lora": 4}, batch_size=2, seq_len=16)) as ctx:
        trained = {n for n, p in ctx.model.named_parameters() if p.requires_grad}
        assert trained and all("lora_" in n for n in trained)
        torch.testing.assert_close(logits(ctx.model.eval(), ids), logits(reference(folder), ids), rtol=0, atol=1e-6)
        before = {n: p.detach().clone() for n, p in ctx.model.named_parameters()}
        ctx.model.train()
        train_step(ctx, next(ctx.batches))
        after = dict(ctx.model.named_parameters())
        changed = {n for n in before if not torch.equal(before[n], after[n])}
        assert changed and changed <= trained  # the base as the folder holds it; adapters moved


LLAMA_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.mark.parametrize("mode", ["nf4", "int8"])
def test_quantized_base_loads_the_folder_quantized_as_peft_users_do(folders, monkeypatch, mode):
    pytest.importorskip("bitsandbytes")
    import bitsandbytes as bnb

    from scalekit.toggles import quantized_base

    folder, ids = folders["llama"], some_ids(folders["llama"])
    common = dict(model=str(folder), device="cpu", toggles={"lora": 4, "quantized_base": mode}, batch_size=2,
                  seq_len=16)
    with built(RunConfig(**common, adapter_targets=LLAMA_LINEARS)) as ctx:  # layers by name: swapped once loaded
        swapped = logits(ctx.model.eval(), ids)

    def no_swap(*args):
        raise AssertionError("the fp32 base was loaded and swapped")

    monkeypatch.setattr(quantized_base, "quantize_targets", no_swap)
    with built(RunConfig(**common)) as ctx:  # every block linear: transformers quantizes them as it loads
        q_proj = ctx.base_model.model.layers[0].self_attn.q_proj
        kind = bnb.nn.Linear4bit if mode != "int8" else bnb.nn.Linear8bitLt
        assert isinstance(q_proj.base_layer, kind) and ctx.base_model.hf_quantizer is not None
        assert f"loaded in {mode} from the checkpoint (transformers' BitsAndBytesConfig)" in " ".join(ctx.notes)
        assert all("lora_" in n for n, p in ctx.model.named_parameters() if p.requires_grad)
        # the same quantization of the same weights as scalekit's swap, to the bit
        assert torch.equal(logits(ctx.model.eval(), ids), swapped)
        want = logits(reference(folder), ids)  # and the folder's model (random weights: off by ≈1.4 here)
        assert (swapped - want).norm() < 0.25 * want.norm()
        ctx.model.train()
        assert torch.isfinite(train_step(ctx, next(ctx.batches)))


def test_the_planner_reads_shapes_only(folders, monkeypatch):
    folder = folders["gpt2"]
    params = sum(p.numel() for p in reference(folder).parameters())

    def no_weights(*args, **kwargs):
        raise AssertionError("the planner read the weights")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_weights)
    cfg = RunConfig(model=str(folder), device="cpu", batch_size=2, seq_len=16)
    assert scalekit.estimate(cfg).n_params == params
    assert scalekit.plan.check_fits(cfg.resolve(scalekit.detect("cpu")), scalekit.detect("cpu")) is None


# -- generation: the folder's tokenizer, transformers' own greedy tokens -------------------------------------------
@pytest.mark.parametrize("family", CHECKPOINT_FAMILIES)
def test_greedy_tokens_equal_transformers_generate_on_the_folders_tokenizer(folders, family):
    folder = folders[family]
    result = generate(GenerateConfig(model=str(folder), prompts=PROMPT, max_new_tokens=10, **QUICK))
    assert result.ok, result.error
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = reference(folder)
    ids = torch.tensor([tok.encode(PROMPT)])
    config = transformers.GenerationConfig(max_new_tokens=10, do_sample=False, pad_token_id=tok.pad_token_id)
    model.generation_config.eos_token_id = None  # exactly 10 tokens, as scalekit's greedy steps make
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config, eos_token_id=None)
    assert result.token_ids == [out[0, ids.shape[1]:].tolist()]
    assert result.texts == [PROMPT + tok.decode(result.token_ids[0])]


def test_quality_reads_the_held_out_text_in_the_folders_tokens(folders):
    from scalekit.data import split_text

    folder = folders["gpt2"]
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    cfg = GenerateConfig(model=str(folder), prompts=PROMPT, max_new_tokens=2, quality_windows=2, device="cpu")
    assert cfg.quality_tokens[:100] == tok.encode(split_text("val")[:1000])[:100]
    assert len(cfg.quality_tokens) > 2 * cfg.quality_window()  # enough for every window asked for
    assert GenerateConfig(model=str(folder), prompts=PROMPT, quality_tokens=[1, 2, 3]).quality_tokens == [1, 2, 3]


# -- the Lab and the command line ----------------------------------------------------------------------------------
def test_the_lab_takes_a_folder(folders):
    pytest.importorskip("ipywidgets")
    from scalekit import Lab

    lab = Lab(model=str(folders["gpt2"]), device="cpu", hw=scalekit.detect("cpu"))
    assert isinstance(lab.base_config.model, HFCheckpoint) and lab.base_config.model.folder == folders["gpt2"]
    assert "finetune" in lab.panel.controls and "quantized_base" in lab.panel.controls  # offered for it
    generation = Lab(task="generate", model=str(folders["gpt2"]), device="cpu", hw=scalekit.detect("cpu"))
    tok = transformers.AutoTokenizer.from_pretrained(folders["gpt2"])
    assert generation.base_config.model.folder == folders["gpt2"]
    assert generation.base_config.tokenizer.encode(PROMPT) == tok.encode(PROMPT)  # prompts read with its tokenizer


def test_the_command_line_runs_a_folder(folders, tmp_path, capsys):
    folder = str(folders["llama"])
    out = tmp_path / "bench.json"
    assert main(["bench", "--hf-model", folder, "--steps", "2", "--warmup-steps", "0", "--device", "cpu",
                 "--batch-size", "2", "--seq-len", "16", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["config"]["model"] == folder
    assert main(["generate", "--hf-model", folder, "--prompt", PROMPT, "--max-new-tokens", "3", "--device", "cpu",
                 "--warmup-tokens", "0", "--no-quality", "--no-measure-memory"]) == 0
    capsys.readouterr()
    assert main(["toggles", "--hf-model", folder, "--device", "cpu"]) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"what applies to Hugging Face LlamaForCausalLM from {folder}:")
    assert said == str(scalekit.applicable(folder, device="cpu")) + "\n"  # the same from Python, by its path


def test_export_writes_the_folders_from_pretrained(folders, capsys):
    folder = folders["llama"]
    assert main(["export", "hf", "--hf-model", str(folder), "--toggle", "sdpa"]) == 0
    code = capsys.readouterr().out
    line = next(x for x in code.splitlines() if x.startswith("model = "))
    assert line == f'model = AutoModelForCausalLM.from_pretrained({str(folder)!r}, dtype="float32", ' \
                   f'attn_implementation="sdpa")'
    namespace = {"AutoModelForCausalLM": transformers.AutoModelForCausalLM}
    exec(line, namespace)  # the exported line loads the model scalekit ran
    ids = some_ids(folder)
    with built(RunConfig(model=str(folder), device="cpu", toggles=["sdpa"])) as ctx:
        assert torch.equal(logits(namespace["model"].eval(), ids), logits(ctx.base_model.eval(), ids))


# -- refusals, each before any weight is read ----------------------------------------------------------------------
@pytest.fixture
def no_weight_read(monkeypatch):
    def read(*args, **kwargs):
        raise AssertionError("weights were read")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", read)


def broken_folders(root, folder):
    """Folders that are not loadable checkpoints, each with the words its refusal says."""
    no_config = root / "no-config"
    shutil.copytree(folder, no_config)
    (no_config / "config.json").unlink()
    no_weights = root / "no-weights"
    shutil.copytree(folder, no_weights)
    (no_weights / "model.safetensors").unlink()
    unknown = root / "unknown"
    shutil.copytree(folder, unknown)
    (unknown / "config.json").write_text(json.dumps({"model_type": "not-a-model"}))
    not_causal = root / "not-causal"
    shutil.copytree(folder, not_causal)
    (not_causal / "config.json").write_text(json.dumps({"model_type": "vit"}))
    return {root / "nowhere": f"{root / 'nowhere'}: no such folder",
            no_config: f"{no_config / 'config.json'}: missing",
            no_weights: f"{no_weights}: no weights (looked for model.safetensors",
            unknown: f"{unknown / 'config.json'}: model_type 'not-a-model' is not an architecture",
            not_causal: f"{not_causal / 'config.json'}: model_type 'vit' (ViTConfig) has no causal-LM model"}


def test_a_folder_that_is_not_a_checkpoint_is_refused_naming_the_file(folders, tmp_path, no_weight_read, capsys):
    for path, words in broken_folders(tmp_path, folders["gpt2"]).items():
        with pytest.raises(ConfigError) as refused:
            RunConfig(model=str(path))
        assert str(refused.value).startswith("RunConfig.model: ") and words in str(refused.value)
        with pytest.raises(ConfigError, match="GenerateConfig.model: "):
            GenerateConfig(model=str(path))
        assert main(["bench", "--hf-model", str(path), "--device", "cpu"]) == 2
        assert f"--hf-model: {words}" in capsys.readouterr().err


def test_missing_tokenizer_files_are_refused_where_text_needs_them(folders, tmp_path, no_weight_read):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(folders["gpt2"] / name, bare / name)
    with pytest.raises(ConfigError, match=rf"GenerateConfig.model: {bare}: no tokenizer files \(looked for "
                                          rf"tokenizer.json"):
        GenerateConfig(model=str(bare), prompts="ROMEO:")
    assert GenerateConfig(model=str(bare), prompts=[[5, 6, 7]], **QUICK).tokenizer is None  # ids need none
    assert isinstance(RunConfig(model=str(bare)).model, HFCheckpoint)  # training on token windows needs none


def test_a_model_larger_than_the_memory_allowed_is_refused_with_its_size(folders, monkeypatch, no_weight_read):
    monkeypatch.setattr(scalekit.plan, "machine_limit", lambda hw: MemoryLimit(2**16, "a 64 KiB test limit"))
    with pytest.raises(ConfigError, match=r"RunConfig.check_memory: this run's weights, gradients and AdamW state "
                                          r"alone come to 0\.\d GiB, more than 2× this machine's limit of 0\.0 GiB "
                                          r"\(a 64 KiB test limit"):
        scalekit.run(RunConfig(model=str(folders["llama"]), device="cpu", steps=1, warmup_steps=0))


# -- nothing reaches for the network, nothing but scalekit speaks ------------------------------------------------
OFFLINE = r'''
import os, socket, sys
attempts = []

def refuse(*args, **kwargs):
    attempts.append(args[1:2] or args[:1])
    raise OSError("test: no network connection may be attempted")

socket.socket.connect = refuse
socket.socket.connect_ex = refuse
socket.create_connection = refuse

from scalekit.cli.main import main
folder = sys.argv[1]
quick = ["--device", "cpu", "--batch-size", "2", "--seq-len", "16", "--steps", "1", "--warmup-steps", "0"]
assert main(["bench", "--hf-model", folder, *quick, "--toggle", "lora=4", "--toggle", "quantized_base=nf4"]) == 0
assert main(["generate", "--hf-model", folder, "--prompt", "ROMEO: the", "--max-new-tokens", "3", "--device", "cpu",
             "--warmup-tokens", "0"]) == 0
print("attempts", len(attempts), attempts, "offline", os.environ.get("HF_HUB_OFFLINE"))
'''


def test_loading_a_folder_sets_the_hub_offline_attempts_no_connection_and_prints_only_scalekits_words(folders):
    # a fresh process, HF_HUB_OFFLINE unset on purpose: scalekit switches the Hub off itself; every socket refuses
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run([sys.executable, "-c", OFFLINE, str(folders["qwen2"])], capture_output=True, text=True,
                          timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "attempts 0 [] offline 1"
    foreign = library_lines(proc.stdout, proc.stderr)
    assert not foreign, "\n".join(foreign)


def test_the_refusal_is_real():
    # the patched socket does refuse: a connection attempted under it fails and is counted
    code = OFFLINE.split("from scalekit")[0] + (
        "try:\n    socket.create_connection(('127.0.0.1', 9))\nexcept OSError as e:\n    print('refused', e)\n"
        "print('attempts', len(attempts))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "refused test: no network" in proc.stdout and proc.stdout.strip().endswith("attempts 1"), proc.stdout
