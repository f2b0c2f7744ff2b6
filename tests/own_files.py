"""A workstation user's own files, written by the tests themselves (offline): Hugging Face checkpoint folders
of small GPT-2, Llama and Qwen2 models saved with `save_pretrained`, each with a BPE tokenizer trained on the
shipped corpus by the `tokenizers` library and saved beside it, and data files of texts in every format a user
brings (jsonl, json, parquet, a `datasets.save_to_disk` folder, a .txt file, a folder of text files)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from scalekit.data import corpus_text

CHECKPOINT_FAMILIES = ("gpt2", "llama", "qwen2")
VOCAB = 320  # BPE merges on top of the corpus's characters; small enough to train in well under a second
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def corpus_texts(n: int = 64, chars: int = 400) -> list[str]:
    """`n` passages of the shipped corpus, `chars` characters each (the data files' texts)."""
    text = corpus_text()
    return [text[i * chars:(i + 1) * chars] for i in range(n)]


def save_tokenizer(directory: Path, chat_template: bool = False):
    """Train a byte-level BPE tokenizer on the corpus, save it (transformers' files) in `directory`, return it."""
    import tokenizers
    import transformers

    bpe = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=None))
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"],
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
                                             show_progress=False)
    bpe.train_from_iterator([corpus_text()[:200_000]], trainer=trainer)
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>",
                                               bos_token="<|endoftext|>", pad_token="<|endoftext|>")
    if chat_template:
        tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(directory)
    return tok


def checkpoint_config(family: str, vocab_size: int, eos: int):
    import transformers

    llama_like = dict(vocab_size=vocab_size, max_position_embeddings=128, hidden_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, bos_token_id=eos,
                      eos_token_id=eos, pad_token_id=eos)
    build = {
        "gpt2": lambda: transformers.GPT2Config(vocab_size=vocab_size, n_positions=128, n_embd=64, n_layer=2,
                                                n_head=4, bos_token_id=eos, eos_token_id=eos),
        "llama": lambda: transformers.LlamaConfig(**llama_like),
        "qwen2": lambda: transformers.Qwen2Config(**llama_like),
    }
    if family not in build:
        raise KeyError(f"tests/own_files.py: no checkpoint family {family!r}; known: {', '.join(build)}")
    return build[family]()


def save_checkpoint(family: str, directory: Path, seed: int = 0, chat_template: bool = False) -> Path:
    """A checkpoint folder as `save_pretrained` writes it (config.json, model.safetensors) with its tokenizer's
    files beside it; the model's weights are random from `seed`, its vocabulary the tokenizer's."""
    import transformers

    directory = Path(directory)
    tok = save_tokenizer(directory, chat_template=chat_template)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(checkpoint_config(family, len(tok), tok.eos_token_id))
    model.save_pretrained(directory, safe_serialization=True)
    return directory


DATA_FORMATS = ("jsonl", "json", "parquet", "save_to_disk", "txt", "txt_folder")


def write_texts(directory: Path, texts: list[str], fmt: str, field: str = "text") -> Path:
    """`texts` written as a user's data file (or folder) of format `fmt` under `directory`; returns its path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if fmt == "jsonl":
        path = directory / "train.jsonl"
        path.write_text("".join(json.dumps({field: t}) + "\n" for t in texts), encoding="utf-8")
    elif fmt == "json":
        path = directory / "train.json"
        path.write_text(json.dumps([{field: t} for t in texts]), encoding="utf-8")
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = directory / "train.parquet"
        pq.write_table(pa.table({field: texts}), path)
    elif fmt == "save_to_disk":
        import datasets

        path = directory / "saved"
        datasets.Dataset.from_dict({field: texts}).save_to_disk(str(path))
    elif fmt == "txt":
        path = directory / "train.txt"
        path.write_text("\n".join(texts), encoding="utf-8")
    elif fmt == "txt_folder":
        path = directory / "texts"
        path.mkdir(exist_ok=True)
        for i, t in enumerate(texts):
            (path / f"{i:04d}.txt").write_text(t, encoding="utf-8")
    else:
        raise KeyError(f"tests/own_files.py: no data format {fmt!r}; known: {', '.join(DATA_FORMATS)}")
    return path


def write_chats(directory: Path, texts: list[str]) -> Path:
    """A chat-format jsonl (`messages`: a user turn and an assistant turn per line)."""
    path = Path(directory) / "chat.jsonl"
    lines = [json.dumps({"messages": [{"role": "user", "content": t[:80]}, {"role": "assistant", "content": t[80:]}]})
             for t in texts]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
