"""A user's data file (RunConfig(data=PATH), --data PATH): every format gives the token ids of the tokenizer called
directly, the tokenized file is cached (reused, rebuilt when the file or the tokenizer changed), a chat file goes
through the chat template, what cannot be used is refused naming the file and the field, and a run trains on it
(windows, or its documents packed) with its held-out loss measured on the file's tail."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import scalekit
from scalekit import RunConfig
from scalekit.data import CharTokenizer, corpus_text, dataset_loader
from scalekit.data import tokenized as tokenized_module
from scalekit.data.packing import PackedDocuments
from scalekit.data.tokenized import tokenize_file
from scalekit.errors import ConfigError
from scalekit.hf.tokenizer_of import data_tokenizer, no_tokenizer
from scalekit.toggles import TOGGLES
from scalekit.training.engine import heldout_tokens
from scalekit.training.evaluation import heldout_batches
from scalekit.training.finetune import _finetune_base, finetune_config
from tests.own_files import (
    DATA_FORMATS,
    corpus_texts,
    save_checkpoint,
    save_tokenizer,
    write_chats,
    write_texts,
)

transformers = pytest.importorskip("transformers")
pytest.importorskip("datasets")

TEXTS = corpus_texts(24, 300)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALEKIT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return save_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def chat_tok(tmp_path_factory):
    return save_tokenizer(tmp_path_factory.mktemp("chat_tok"), chat_template=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_checkpoint("gpt2", tmp_path_factory.mktemp("gpt2"))


def documents(tokenized) -> list[list[int]]:
    o = tokenized.offsets
    return [tokenized.tokens[a:b].tolist() for a, b in zip(o[:-1], o[1:], strict=True)]


@pytest.mark.parametrize("fmt", DATA_FORMATS)
def test_every_format_gives_the_token_ids_of_the_tokenizer_called_directly(tok, tmp_path, fmt):
    path = write_texts(tmp_path, TEXTS, fmt)
    got = tokenize_file(path, tok)
    if fmt == "txt":  # a .txt file is one document: the whole file
        assert documents(got) == [tok("\n".join(TEXTS))["input_ids"]]
    else:  # one document per row (per file of a folder)
        assert documents(got) == [tok(t)["input_ids"] for t in TEXTS]
    assert got.tokens.dtype == np.uint16 and got.meta["read_field"] == "text"


def test_a_large_file_is_tokenized_in_several_processes_to_the_same_ids(tok, tmp_path, monkeypatch):
    monkeypatch.setattr(tokenized_module, "ROWS_PER_PROCESS", 8)  # 24 rows: a process per 8 rows, at most the cores
    monkeypatch.setattr(tokenized_module.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    got = tokenize_file(write_texts(tmp_path, TEXTS, "jsonl"), tok)
    assert got.meta["num_proc"] == 2 and documents(got) == [tok(t)["input_ids"] for t in TEXTS]


def test_the_built_in_gpt_reads_the_corpus_characters_and_leaves_out_the_others(tmp_path):
    chars = CharTokenizer(corpus_text())
    got = tokenize_file(write_texts(tmp_path, TEXTS, "jsonl"), chars)
    assert documents(got) == [chars.encode(t) for t in TEXTS] and got.notes() == []
    odd = tokenize_file(write_texts(tmp_path / "odd", ["to be 7é or not"], "jsonl"), chars)
    assert documents(odd) == [chars.encode("to be  or not")] and odd.meta["dropped_characters"] == 2
    assert "2 characters" in odd.notes()[0]


def test_a_checkpoint_folder_s_text_goes_through_the_tokenizer_saved_in_it(tmp_path, checkpoint):
    tok = transformers.AutoTokenizer.from_pretrained(checkpoint)
    path = write_texts(tmp_path, TEXTS[:6], "jsonl")
    for model in (str(checkpoint), transformers.AutoModelForCausalLM.from_pretrained(checkpoint)):
        got = tokenize_file(path, data_tokenizer(model, str(path)))
        assert documents(got) == [tok(t)["input_ids"] for t in TEXTS[:6]]


def test_a_named_field_is_read(tok, tmp_path):
    path = write_texts(tmp_path, TEXTS[:4], "parquet", field="body")
    assert documents(tokenize_file(path, tok, "body")) == [tok(t)["input_ids"] for t in TEXTS[:4]]


def test_the_cache_is_reused_and_rebuilt_when_the_file_or_the_tokenizer_changed(tok, chat_tok, tmp_path, cache,
                                                                                monkeypatch):
    calls = []
    real = tokenized_module.tokenize_rows
    monkeypatch.setattr(tokenized_module, "tokenize_rows", lambda *a: calls.append(a) or real(*a))
    path = write_texts(tmp_path, TEXTS, "jsonl")
    first = tokenize_file(path, tok)
    records = list((cache / "data_files").glob("*.json"))
    stamp = records[0].stat().st_mtime_ns
    again = tokenize_file(path, tok)
    assert len(calls) == 1 and records[0].stat().st_mtime_ns == stamp  # read back, not tokenized again
    assert np.array_equal(again.tokens, first.tokens) and np.array_equal(again.offsets, first.offsets)
    path.write_text(json.dumps({"text": "A new line of text."}) + "\n", encoding="utf-8")  # the file changed
    changed = tokenize_file(path, tok)
    assert len(calls) == 2 and documents(changed) == [tok("A new line of text.")["input_ids"]]
    tokenize_file(path, chat_tok)  # another tokenizer (its chat template differs): another key
    assert len(calls) == 3 and len(list((cache / "data_files").glob("*.json"))) == 3


def test_a_chat_file_goes_through_the_chat_template_or_is_refused(tok, chat_tok, tmp_path):
    path = write_chats(tmp_path, TEXTS[:5])
    got = tokenize_file(path, chat_tok)
    chats = [json.loads(line)["messages"] for line in path.read_text(encoding="utf-8").splitlines()]
    want = [chat_tok.apply_chat_template(m, tokenize=True) for m in chats]
    assert documents(got) == [list(w["input_ids"] if hasattr(w, "keys") else w) for w in want]
    assert got.meta["chat"] and got.meta["read_field"] == "messages"
    with pytest.raises(ConfigError, match=r"chat\.jsonl.*chat file.*'messages'.*no chat_template"):
        tokenize_file(path, tok)
    with pytest.raises(ConfigError, match="character tokenizer has none"):
        tokenize_file(path, CharTokenizer(corpus_text()))


def test_what_cannot_be_used_is_refused_naming_the_file_and_the_field(tok, tmp_path):
    bad_line = tmp_path / "bad.jsonl"
    bad_line.write_text('{"text": "fine"}\n{"text": oops}\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad\.jsonl' line 2 is not JSON"):
        tokenize_file(bad_line, tok)
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not a parquet file")
    with pytest.raises(ConfigError, match=r"broken\.parquet' cannot be read as parquet"):
        tokenize_file(broken, tok)
    (tmp_path / "train.csv").write_text("text\nhello\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"train\.csv' has the unknown extension '\.csv'; allowed: \.jsonl"):
        tokenize_file(tmp_path / "train.csv", tok)
    with pytest.raises(ConfigError, match=r"RunConfig\.text_field: .*train\.jsonl' has no field 'body'; its "
                                          r"fields: text"):
        tokenize_file(write_texts(tmp_path, TEXTS[:2], "jsonl"), tok, "body")
    with pytest.raises(ConfigError, match=r"empty\.jsonl' gave no token from its field 'text' \(2 rows"):
        empty = tmp_path / "empty.jsonl"
        empty.write_text('{"text": ""}\n{"text": ""}\n', encoding="utf-8")
        tokenize_file(empty, tok)
    lists = tmp_path / "lists.jsonl"
    lists.write_text('{"text": ["a", "b"]}\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"field 'text' of .*lists\.jsonl' holds neither text nor chats"):
        tokenize_file(lists, tok)
    numbers = tmp_path / "numbers.jsonl"
    numbers.write_text('{"text": 3}\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"field 'text' of .*numbers\.jsonl' holds int64 values, not text"):
        tokenize_file(numbers, tok)


def test_run_config_refuses_a_data_file_it_cannot_use(tmp_path, checkpoint):
    path = write_texts(tmp_path, TEXTS[:4], "jsonl")
    with pytest.raises(ConfigError, match=r"RunConfig.data: unknown data source 'shakespear', and no file"):
        RunConfig(data="shakespear")
    (tmp_path / "x.csv").write_text("text\nhello\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="has the unknown extension '.csv'"):
        RunConfig(data=str(tmp_path / "x.csv"))
    built = transformers.AutoModelForCausalLM.from_config(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2))
    with pytest.raises(ConfigError, match=r"RunConfig.model \(a GPT2LMHeadModel\) has none: give the model as a "
                                          r"checkpoint folder"):
        RunConfig(model=built, data=str(path))
    no_tok = tmp_path / "weights_only"
    no_tok.mkdir()
    assert "weights_only: no tokenizer files (looked for tokenizer.json" in no_tokenizer(str(no_tok), str(path))
    assert "RunConfig.model ('nowhere') has none" in no_tokenizer("nowhere", str(path))
    assert no_tokenizer(str(checkpoint), str(path)) == "" and no_tokenizer(None, str(path)) == ""
    with pytest.raises(ConfigError, match="sequence_packing packs the documents.*built-in GPT's forward"):
        RunConfig(data=str(path), toggles=["sequence_packing"])
    with pytest.raises(ConfigError, match="RunConfig.text_field must be the name of a field"):
        RunConfig(data=str(path), text_field="")


def test_the_data_toggles_act_on_a_data_file(tmp_path):
    cfg = RunConfig(data=str(write_texts(tmp_path, TEXTS[:2], "jsonl")), device="cpu")
    idle = {name for name, t in TOGGLES.items() if t.group == "data" and t.changes_nothing(cfg)}
    assert idle == {"training_format", "vectorized_transforms"}  # no raw text, no per-sample transform
    assert "read in the training format always" in TOGGLES["training_format"].changes_nothing(cfg)


def test_a_run_on_the_built_in_gpt_trains_on_the_file_and_measures_its_held_out_tail(tmp_path):
    path = write_texts(tmp_path, corpus_texts(40, 400), "jsonl")
    cfg = RunConfig(data=str(path), steps=2, warmup_steps=0, seq_len=32, batch_size=4, device="cpu",
                    measure_memory=False, check_memory=False, eval_every=2, eval_batches=1)
    result = scalekit.run(cfg)
    assert result.status == "ok", result.error
    assert result.heldout_loss_before is not None and result.heldout_loss_after is not None and result.evals
    whole = tokenize_file(path, CharTokenizer(corpus_text()))
    cut = int(len(whole.tokens) * 0.9)  # the training part, then the held-out tail
    resolved = cfg.resolve(scalekit.detect("cpu"))
    held = heldout_tokens(resolved)
    assert np.array_equal(held, whole.tokens[cut:cut + len(held)]) and len(held) == 32 * 32 + 1
    x, y = heldout_batches(resolved, "cpu")[0]  # eval_every reads the same tail
    assert x[0].tolist() == whole.tokens[cut:cut + 32].tolist() and y[0].tolist() == whole.tokens[cut + 1:cut + 33].tolist()


def test_a_packed_file_read_by_workers_gives_the_same_batches_once_each(tok, tmp_path):
    docs = tokenize_file(write_texts(tmp_path, corpus_texts(48, 150), "jsonl"), tok).documents("train")

    def first_batches(workers: int) -> list:
        loader = iter(dataset_loader(PackedDocuments(docs, 64, 0, batch_size=2), 2, 0, num_workers=workers))
        return [next(loader)["input_ids"] for _ in range(6)]

    alone = first_batches(0)
    assert len({tuple(b.flatten().tolist()) for b in alone}) == 6  # six different batches
    assert all(torch.equal(a, b) for a, b in zip(alone, first_batches(2), strict=True))


def test_the_finetune_ladder_keeps_the_data_file(tmp_path):
    path = str(write_texts(tmp_path, TEXTS[:2], "jsonl"))
    assert _finetune_base(RunConfig(data=path, steps=2)).data == path
    assert finetune_config(data=path).data == path and _finetune_base(RunConfig(steps=2)).data == "new-plays"


@pytest.mark.parametrize("packing", [False, True], ids=["windows", "packed"])
def test_a_run_on_a_checkpoint_trains_on_the_file_with_its_own_tokenizer(tmp_path, checkpoint, packing):
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint)  # name_or_path: the folder
    path = write_texts(tmp_path, corpus_texts(48, 300), "parquet")
    toggles = {"sequence_packing": True} if packing else {}
    result = scalekit.run(RunConfig(model=model, data=str(path), toggles=toggles, steps=2, warmup_steps=0, seq_len=64,
                                    batch_size=4, device="cpu", measure_memory=False, check_memory=False))
    assert result.status == "ok", result.error
    assert result.heldout_loss_before is not None and result.heldout_loss_after is not None
    assert any("sequence_packing: documents packed" in n for n in result.notes) == packing
