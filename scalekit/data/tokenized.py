"""A user's data file tokenized once with the model's own tokenizer, cached in the training format, read back.

`tokenize_file(path, tokenizer, field)` reads the file (scalekit.data.files: one row per document), tokenizes
its text field through `datasets` (`map(batched=True, num_proc=...)`: one process for a small file, up to one per
core for a large one) and writes the training format under the scalekit cache (`cache_dir()/data_files/`):
`<key>.tokens.bin` (every document's token ids end to end, uint16 when the vocabulary fits, else uint32),
`<key>.offsets.bin` (int64: where each document starts, and the end) and `<key>.json` (how it was built, written
last: it vouches for the other two).  Each file is written atomically (scalekit.files).  The key is a hash of the
file's bytes (a folder: of its files), of the tokenizer (its serialized vocabulary, merges, special tokens and
chat template), of the field and of the cache's format: a changed file or tokenizer gets a new key and is
tokenized again; the same ones reuse the files without tokenizing.

Text is tokenized as calling the tokenizer on it does (`tokenizer(text)["input_ids"]`, with the special tokens it
adds).  A chat file (a field of message lists, such as `messages`) goes through the tokenizer's chat template
(`apply_chat_template`), and is refused when the tokenizer has none.  The built-in GPT's character tokenizer
(scalekit.data.CharTokenizer) leaves out the characters it has no id for, and the run's notes say how many.

The training part of the file is its first 90% of tokens, the held-out part the rest (the shipped corpus's split,
VAL_FRACTION): a document across the cut becomes two, one on each side.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from ..errors import ConfigError, TokenCacheUnavailable, is_no_space, why_not_written
from ..files import expand_user, write_atomic, write_text_atomic
from .files import content_hash, datasets_library, read_rows
from .shakespeare import VAL_FRACTION, CharTokenizer, cache_dir

CACHE_FORMAT = 1
ROWS_PER_PROCESS = 20_000  # below this many rows per process, starting processes costs more than it saves
FIELD = "RunConfig.text_field"


def tokenizer_hash(tokenizer) -> str:
    """sha256 of what decides a tokenizer's ids: its serialized vocabulary and merges (a fast tokenizer's whole
    tokenizer.json), special tokens, added tokens and chat template; a CharTokenizer: its characters."""
    if isinstance(tokenizer, CharTokenizer):
        said = {"characters": "".join(tokenizer.chars)}
    else:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        said = {"class": type(tokenizer).__name__,
                "serialized": backend.to_str() if backend is not None else sorted(tokenizer.get_vocab().items()),
                "special": str(getattr(tokenizer, "special_tokens_map", {})),
                "added": sorted(str(t) for t in getattr(tokenizer, "added_tokens_decoder", {}).values()),
                "chat_template": str(getattr(tokenizer, "chat_template", None))}
    return hashlib.sha256(json.dumps(said, sort_keys=True, default=str).encode("utf-8")).hexdigest()


def vocab_size(tokenizer) -> int:
    return tokenizer.vocab_size if isinstance(tokenizer, CharTokenizer) else len(tokenizer)


class Encoder:
    """Token ids of a batch of rows (a module-level class: worker processes receive it by pickling)."""

    def __init__(self, tokenizer, field: str, chat: bool):
        self.tokenizer, self.field, self.chat = tokenizer, field, chat

    def __call__(self, batch: dict) -> dict:
        values = batch[self.field]
        tok = self.tokenizer
        if self.chat:
            ids = [_ids(tok.apply_chat_template(m, tokenize=True)) if m else [] for m in values]
            return {"input_ids": ids, "dropped": [0] * len(ids)}
        texts = ["" if t is None else t for t in values]
        if isinstance(tok, CharTokenizer):
            kept = [[c for c in t if c in tok.stoi] for t in texts]
            return {"input_ids": [tok.encode(k) for k in kept],
                    "dropped": [len(t) - len(k) for t, k in zip(texts, kept, strict=True)]}
        return {"input_ids": tok(texts, verbose=False)["input_ids"], "dropped": [0] * len(texts)}


def _ids(encoded) -> list[int]:
    """apply_chat_template's ids: a list (transformers 4) or a BatchEncoding holding them (transformers 5)."""
    return list(encoded["input_ids"]) if hasattr(encoded, "keys") else list(encoded)


@dataclass
class TokenizedFile:
    """A data file in the training format: `tokens` end to end, document k at tokens[offsets[k]:offsets[k+1]]."""

    path: str
    tokens: np.ndarray
    offsets: np.ndarray
    meta: dict

    @property
    def cut(self) -> int:
        """Where the held-out part begins: after the first 90% of tokens (the corpus's split)."""
        return int(len(self.tokens) * (1 - VAL_FRACTION))

    def part(self, part: str) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, document offsets) of `part`: 'train' (the first 90% of tokens) or 'heldout' (the rest)."""
        if part not in ("train", "heldout"):
            raise ValueError(f"part must be 'train' or 'heldout', got {part!r}")
        start, end = (0, self.cut) if part == "train" else (self.cut, len(self.tokens))
        bounds = np.unique(np.clip(self.offsets, start, end)) - start
        return self.tokens[start:end], bounds

    def documents(self, part: str = "train") -> Documents:
        return Documents(*self.part(part))

    def notes(self) -> list[str]:
        dropped = self.meta.get("dropped_characters", 0)
        if not dropped:
            return []
        return [f"data {self.path}: {dropped:,} characters the built-in GPT's character tokenizer has no id for "
                f"were left out (it knows the shipped corpus's {self.meta['vocab_size']} characters); give a "
                f"checkpoint folder as the model to tokenize with its own tokenizer"]


class Documents(Dataset):
    """The documents of a part of a tokenized file, one per item: {"input_ids": its token ids} (the empty left
    out), as sequence_packing reads a dataset."""

    def __init__(self, tokens: np.ndarray, bounds: np.ndarray):
        self.tokens = tokens
        self.spans = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]

    def __len__(self) -> int:
        return len(self.spans)

    def __getitem__(self, i: int) -> dict:
        a, b = self.spans[i]
        return {"input_ids": torch.from_numpy(np.asarray(self.tokens[a:b]).astype(np.int64))}


def files_dir() -> Path:
    return cache_dir() / "data_files"


_HASHES: dict[tuple, str] = {}  # (path, every file's name, size, mtime, inode) -> content hash, in this process


def _content_key(path: Path) -> str:
    files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
    marks = []
    for f in files:
        st = f.stat()
        marks.append((str(f), st.st_size, st.st_mtime_ns, st.st_ino))
    seen = (str(path.resolve()), tuple(marks))
    if seen not in _HASHES:
        _HASHES[seen] = content_hash(path)
    return _HASHES[seen]


def tokenize_file(path: str | os.PathLike, tokenizer, field: str = "text") -> TokenizedFile:
    """The file's `field` tokenized with `tokenizer`, from the cache when its key matches, else built and cached."""
    p = expand_user(path)
    key_fields = {"format": CACHE_FORMAT, "content": _content_key(p), "tokenizer": tokenizer_hash(tokenizer),
                  "field": field}
    key = hashlib.sha256(json.dumps(key_fields, sort_keys=True).encode("utf-8")).hexdigest()[:32]
    cached = _read_cache(key, str(p))
    if cached is not None:
        return cached
    tokens, offsets, meta = tokenize_rows(p, tokenizer, field)
    meta.update(key_fields, key=key, source=str(p))
    _write_cache(key, tokens, offsets, meta)
    return _read_cache(key, str(p))


def _column(p: Path, rows, field: str) -> tuple[str, bool]:
    """The field read and whether it holds chats (lists of messages), or a refusal naming the file and the field."""
    names = list(rows.column_names)
    if field not in names:
        if field == "text" and "messages" in names:
            field = "messages"  # a chat file: its messages, through the chat template
        else:
            raise ConfigError(f"{FIELD}: {str(p)!r} has no field {field!r}; its fields: {', '.join(names) or 'none'}")
    feature = rows.features[field]
    dtype = getattr(feature, "dtype", None)
    if dtype is not None and dtype not in ("string", "large_string"):
        raise ConfigError(f"{FIELD}: the field {field!r} of {str(p)!r} holds {dtype} values, not text; its fields: "
                          f"{', '.join(names)}")
    chat = dtype is None
    first = next((v for v in rows[field] if v), None) if chat else None
    if chat and not (isinstance(first, list) and all(isinstance(m, dict) and {"role", "content"} <= set(m)
                                                     for m in first)):
        raise ConfigError(f"{FIELD}: the field {field!r} of {str(p)!r} holds neither text nor chats (lists of "
                          f"{{'role', 'content'}} messages); its fields: {', '.join(names)}")
    return field, chat


def tokenize_rows(p: Path, tokenizer, field: str) -> tuple[np.ndarray, np.ndarray, dict]:
    """Read and tokenize the file (no cache): its tokens end to end, the document offsets, and what was done."""
    rows = read_rows(p)
    if len(rows) == 0:
        raise ConfigError(f"RunConfig.data: {str(p)!r} holds no row")
    field, chat = _column(p, rows, field)
    if chat and getattr(tokenizer, "chat_template", None) is None:
        whose = "the built-in GPT's character tokenizer has none" if isinstance(tokenizer, CharTokenizer) else \
            f"the tokenizer ({type(tokenizer).__name__}) has no chat_template"
        raise ConfigError(f"RunConfig.data: {str(p)!r} is a chat file (its field {field!r} holds messages), which "
                          f"is tokenized with the tokenizer's chat template, and {whose}: give a model whose "
                          f"tokenizer has a chat template, or a file of plain text (a 'text' field)")
    datasets = datasets_library()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    num_proc = max(1, min(cores, len(rows) // ROWS_PER_PROCESS))
    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        done = rows.map(Encoder(tokenizer, field, chat), batched=True, num_proc=num_proc if num_proc > 1 else None,
                        remove_columns=rows.column_names, keep_in_memory=True, new_fingerprint=f"scalekit-{field}")
    except Exception as exc:  # the tokenizer or its chat template refused a row: said with the file and the field
        raise ConfigError(f"RunConfig.data: {str(p)!r}: tokenizing its field {field!r} failed "
                          f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from exc
    finally:
        if bars:
            datasets.enable_progress_bars()
    tokens, offsets = _flat(done)
    if len(tokens) == 0:
        raise ConfigError(f"RunConfig.data: {str(p)!r} gave no token from its field {field!r} ({len(rows):,} rows, "
                          f"all empty{' once the unknown characters were left out' if sum(done['dropped']) else ''})")
    size = vocab_size(tokenizer)
    dtype = np.uint16 if max(size, int(tokens.max()) + 1) <= 2**16 else np.uint32
    meta = {"documents": len(offsets) - 1, "tokens": len(tokens), "dtype": np.dtype(dtype).name,
            "vocab_size": size, "read_field": field, "chat": chat, "num_proc": num_proc,
            "dropped_characters": int(sum(done["dropped"]))}
    return tokens.astype(dtype), offsets, meta


def _flat(done) -> tuple[np.ndarray, np.ndarray]:
    import pyarrow.compute as pc

    column = done.data.column("input_ids")
    lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False).astype(np.int64)
    tokens = pc.list_flatten(column).to_numpy().astype(np.int64) if lengths.sum() else np.zeros(0, np.int64)
    return tokens, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def _paths(key: str) -> tuple[Path, Path, Path]:
    d = files_dir()
    return d / f"{key}.tokens.bin", d / f"{key}.offsets.bin", d / f"{key}.json"


def _read_cache(key: str, source: str) -> TokenizedFile | None:
    """The cached files of `key`, when their record is there and their sizes match it; else None."""
    tokens_path, offsets_path, meta_path = _paths(key)
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        itemsize = np.dtype(meta["dtype"]).itemsize
        if meta.get("key") != key or tokens_path.stat().st_size != itemsize * meta["tokens"] or \
                offsets_path.stat().st_size != 8 * (meta["documents"] + 1):
            return None
        tokens = np.memmap(tokens_path, dtype=meta["dtype"], mode="r")
        offsets = np.fromfile(offsets_path, dtype=np.int64)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return TokenizedFile(path=source, tokens=tokens, offsets=offsets, meta=meta)


def _write_cache(key: str, tokens: np.ndarray, offsets: np.ndarray, meta: dict) -> None:
    tokens_path, offsets_path, meta_path = _paths(key)
    try:
        files_dir().mkdir(parents=True, exist_ok=True)
        write_atomic(tokens_path, lambda f: f.write(tokens.tobytes()), binary=True)
        write_atomic(offsets_path, lambda f: f.write(offsets.tobytes()), binary=True)
        write_text_atomic(meta_path, json.dumps(meta, indent=1))  # last: the record vouches for the files
    except OSError as exc:
        where = "free some space there, or set SCALEKIT_CACHE to a folder on another disk" if is_no_space(exc) \
            else "set SCALEKIT_CACHE to a folder you can write"
        raise TokenCacheUnavailable(f"the token cache {str(files_dir())!r} cannot be written: "
                                    f"{why_not_written(exc)}; {where}") from exc
