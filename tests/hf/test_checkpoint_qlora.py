"""QLoRA from a checkpoint folder on disk, on a data file of the user's: the adapters alone train over a base
transformers loaded in 4-bit, held-out loss is reported before and after, the merge saved as a plain checkpoint
loads in transformers with the merged model's logits, and the fine-tuning ladder runs on the folder and file."""

from __future__ import annotations

import importlib.util

import pytest
import torch

transformers = pytest.importorskip("transformers")
# found, not imported: bitsandbytes imported at collection would keep the forking tests from forking
pytestmark = pytest.mark.skipif(not (importlib.util.find_spec("bitsandbytes") and importlib.util.find_spec("peft")),
                                reason="QLoRA needs bitsandbytes and peft (pip install 'scalekit[hf]')")

import scalekit  # noqa: E402
from scalekit import ConfigError, RunConfig  # noqa: E402
from scalekit.cli.main import main  # noqa: E402
from scalekit.models import lora_files  # noqa: E402
from scalekit.training.build import train_step  # noqa: E402
from tests.helpers import built, one_thread  # noqa: E402
from tests.own_files import corpus_texts, save_checkpoint, write_texts  # noqa: E402

QUICK = dict(steps=3, warmup_steps=1, batch_size=4, seq_len=64, device="cpu", measure_memory=False)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("own")
    with one_thread():
        yield save_checkpoint("llama", root / "ckpt"), write_texts(root / "data", corpus_texts(120, 400), "jsonl")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALEKIT_CACHE", str(tmp_path / "cache"))


def qlora(folder, data, **kw):
    return RunConfig(model=str(folder), data=str(data), toggles={"lora": 8, "quantized_base": "nf4"}, **QUICK, **kw)


def test_qlora_on_a_folder_trains_the_adapters_only_over_a_4_bit_base(files):
    with one_thread(), built(qlora(*files)) as ctx:
        names = {n for n, p in ctx.model.named_parameters() if p.requires_grad}
        assert names and all("lora_" in n for n in names), sorted(names)[:5]
        kinds = {type(m).__name__ for m in ctx.model.modules()}
        assert "Linear4bit" in kinds, kinds  # the base as transformers loaded it through BitsAndBytesConfig
        frozen = {n: p.detach().clone() for n, p in ctx.model.named_parameters() if not p.requires_grad}
        adapters = {n: p.detach().clone() for n, p in ctx.model.named_parameters() if p.requires_grad}
        for _ in range(2):
            train_step(ctx, next(ctx.batches))
        after = dict(ctx.model.named_parameters())
        assert all(torch.equal(frozen[n], after[n]) for n in frozen)
        assert any(not torch.equal(adapters[n], after[n]) for n in adapters)


def test_qlora_on_a_folder_and_file_reports_held_out_loss_before_and_after(files):
    with one_thread():
        r = scalekit.run(qlora(*files))
    assert r.status == "ok", r.error
    assert r.heldout_loss_before is not None and r.heldout_loss_after is not None
    assert r.trainable_params < r.total_params if hasattr(r, "total_params") else r.trainable_share < 0.5


def test_the_merge_saved_as_a_checkpoint_gives_the_merged_models_logits(files, tmp_path):
    folder, data = files
    ids = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(0))
    with one_thread(), built(qlora(folder, data)) as ctx:
        for _ in range(2):
            train_step(ctx, next(ctx.batches))
        ctx.model.eval()
        with torch.no_grad():
            adapted = ctx.model(ids).logits
        out = lora_files.save_merged(ctx.model, tmp_path / "merged", tokenizer_from=folder)
        merged = ctx.model  # merge_and_unload folds the adapters into the base in place
        with torch.no_grad():
            merged_logits = merged(ids).logits
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    assert "quantization_config" not in (out / "config.json").read_text()  # a plain checkpoint: no bitsandbytes
    back = transformers.AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    with torch.no_grad():
        loaded = back(ids).logits
    torch.testing.assert_close(loaded, merged_logits, atol=1e-5, rtol=1e-5)
    assert (loaded - adapted).abs().max() < 0.5  # the 4-bit re-rounding of the merge, small beside the logits
    with pytest.raises(ConfigError, match="exists; give a new folder"):
        lora_files.save_merged(back, out)  # refused before anything is merged


def test_the_finetune_ladder_runs_on_the_folder_and_the_file(files, capsys):
    folder, data = files
    with one_thread():
        code = main(["ladder", "finetune", "--hf-model", str(folder), "--data", str(data), "--steps", "2",
                     "--warmup-steps", "1", "--repeats", "1", "--batch-size", "4", "--seq-len", "64",
                     "--device", "cpu"])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = [line for line in out.splitlines() if line.startswith(("full fine-tuning", "head only", "LoRA", "DoRA",
                                                                  "QLoRA"))]
    assert len(rows) == 6, out
    assert all(" → " in row for row in rows), rows  # held-out loss before → after on every row
    assert all("FAILED" not in row and "DIVERGED" not in row for row in rows), rows
