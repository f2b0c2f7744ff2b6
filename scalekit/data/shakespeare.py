"""The shipped Tiny Shakespeare corpus (public domain), a character tokenizer, and its training format.

Training format: the corpus tokenized once into a flat array of uint16 token ids on disk, read back as a
memmap, so every run starts from the same bytes without re-tokenizing.  Written atomically (temporary
file, fsynced, then renamed): an interrupted preparation never leaves a half-written file behind.  The
size and a checksum of each file are recorded beside them when they are built and checked when the
cache is first opened in a process, and again when its files changed since (each open compares their inode,
size and times); a file that does not match is built again, with a one-line note on stderr.  A cache that
cannot be written says where it is, why, and that SCALEKIT_CACHE puts it elsewhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from importlib import resources
from pathlib import Path

import numpy as np

from ..errors import TokenCacheUnavailable, is_no_space, why_not_written
from ..files import write_atomic, write_text_atomic

CORPUS_NAME = "tinyshakespeare.txt"
VAL_FRACTION = 0.1


def corpus_text() -> str:
    return resources.files("scalekit.data").joinpath(CORPUS_NAME).read_text(encoding="utf-8")


class CharTokenizer:
    """One token per distinct character of the corpus (65 for Tiny Shakespeare)."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, s: str) -> list[int]:
        return [self.stoi[c] for c in s]

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def cache_dir() -> Path:
    """$SCALEKIT_CACHE, else scalekit/ under $XDG_CACHE_HOME, else ~/.cache/scalekit."""
    if os.environ.get("SCALEKIT_CACHE"):
        return Path(os.environ["SCALEKIT_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    # the XDG spec: an empty value means unset, and a relative path is invalid and ignored.  Taken as it is, it
    # would put a scalekit/ folder in the current one, which shadows the package in an editable install
    base = xdg if os.path.isabs(xdg) else os.path.expanduser("~/.cache")
    return Path(base) / "scalekit"


CACHE_FORMAT = 1


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _meta_path() -> Path:
    return cache_dir() / "shakespeare_char.json"


def _expected() -> dict:
    """What the cache must hold: recorded beside the token files when they are built, checked on every open."""
    text = corpus_text()
    ids = np.array(CharTokenizer(text).encode(text), dtype=np.uint16)
    n_train = int(len(ids) * (1 - VAL_FRACTION))
    parts = {"train": ids[:n_train], "val": ids[n_train:]}
    return {"format": CACHE_FORMAT, "corpus_sha256": _digest(text.encode("utf-8")), "val_fraction": VAL_FRACTION,
            "splits": {k: {"tokens": len(v), "sha256": _digest(v.tobytes())} for k, v in parts.items()}}, parts


def _problem(meta) -> str | None:
    """Why the cache on disk cannot be used (None: it can)."""
    if meta is None:
        return "no record of how it was built"
    shape = _shape_problem(meta)
    if shape is not None:
        return shape
    if meta["format"] != CACHE_FORMAT or meta["val_fraction"] != VAL_FRACTION:
        return "it was built by another version of scalekit"
    for split, want in meta["splits"].items():
        path = cache_dir() / f"shakespeare_char_{split}.bin"
        if not path.exists():
            return f"{path.name} is missing"
        if path.stat().st_size != 2 * want["tokens"]:
            return f"{path.name} has {path.stat().st_size:,} bytes, not {2 * want['tokens']:,}"
        if _digest(path.read_bytes()) != want["sha256"]:
            return f"{path.name}'s content does not match its recorded checksum"
    return None


def _shape_problem(meta) -> str | None:
    """Valid JSON can still be the wrong record (a list, a split without its size): said, never raised."""
    splits = meta.get("splits") if isinstance(meta, dict) else None
    if not isinstance(splits, dict) or set(splits) != {"train", "val"} or "format" not in meta \
            or "val_fraction" not in meta:
        return "its record is not in the form scalekit writes"
    for want in splits.values():
        if not isinstance(want, dict) or not isinstance(want.get("sha256"), str) or \
                isinstance(want.get("tokens"), bool) or not isinstance(want.get("tokens"), int):
            return "its record is not in the form scalekit writes"
    return None


def _read_meta() -> dict | None:
    try:
        return json.loads(_meta_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _build_cache(why: str | None) -> None:
    directory = cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        meta, parts = _expected()
        for split, ids in parts.items():
            # f.write, not ndarray.tofile: numpy reports a short write without the system's reason (a full disk)
            write_atomic(directory / f"shakespeare_char_{split}.bin", lambda f, ids=ids: f.write(ids.tobytes()),
                         binary=True)
        write_text_atomic(_meta_path(), json.dumps(meta, indent=1))  # last: the record vouches for the files
    except OSError as exc:
        raise TokenCacheUnavailable(_unwritable(directory, exc)) from exc
    if why is not None:
        print(f"scalekit: note: rebuilt the token cache in {directory} ({why})", file=sys.stderr)


def _unwritable(directory: Path, exc: OSError) -> str:
    """The cache folder that cannot be written, why, and where else it can go."""
    where = "free some space there, or set SCALEKIT_CACHE to a folder on another disk" if is_no_space(exc) else \
        "set SCALEKIT_CACHE to a folder you can write"
    return f"the token cache {str(directory)!r} cannot be written: {why_not_written(exc)}; {where}"


STALE_TEMP_AGE_S = 600  # a build writes each file in one call and renames it within seconds
_TEMP_GLOB = ".shakespeare_char*.tmp"  # write_atomic's temporary files for the cache


def _remove_stale_temps(directory: Path) -> None:
    """Temporary files whose writer was killed mid-build (SIGKILL: nothing could remove them): untouched for
    STALE_TEMP_AGE_S, so no build is still writing them."""
    now = time.time()
    for tmp in directory.glob(_TEMP_GLOB):
        try:
            if now - tmp.stat().st_mtime > STALE_TEMP_AGE_S:
                tmp.unlink()
        except OSError:  # removed by another process first, or a folder we cannot write: it stays
            pass


_CACHE_FILES = ("shakespeare_char_train.bin", "shakespeare_char_val.bin", "shakespeare_char.json")
_VALIDATED: dict[str, tuple] = {}  # cache folder -> its files' fingerprint when this process last checked them


def _fingerprint(directory: Path) -> tuple | None:
    """Each cache file's device, inode, size, mtime and ctime (None if one is missing): three stats, cheap on
    every open, and changed by a deletion, a replacement or a write in place (ctime cannot be set back)."""
    marks = []
    for name in _CACHE_FILES:
        try:
            st = os.stat(directory / name)
        except OSError:
            return None
        marks.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(marks)


def _check_cache(directory: Path) -> None:
    """Check the files against their record (their checksums), build them again if they do not match, and
    remember their fingerprint: until it changes, this process trusts them without reading them again."""
    _remove_stale_temps(directory)
    seen = _fingerprint(directory)
    problem = _problem(_read_meta())
    if problem is not None:
        _build_cache(problem if any(directory.glob("shakespeare_char_*.bin")) else None)
        seen = _fingerprint(directory)
    _VALIDATED[str(directory)] = seen


def training_file(split: str = "train") -> Path:
    """Path of the uint16 token file for `split` ("train" or "val"), checked against its record (and built
    again if it does not match) the first time this process opens the cache, and again whenever its files are
    no longer the ones checked (deleted, replaced or written to since: a long notebook session)."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    directory = cache_dir()
    seen = _fingerprint(directory)
    if seen is None or _VALIDATED.get(str(directory)) != seen:
        _check_cache(directory)
    return directory / f"shakespeare_char_{split}.bin"


NEW_PLAYS_TRAIN_FRACTION = 0.8
# Slices of the held-out tail ("val"), which the shipped model never saw: fine-tuning trains on the first
# 80% of it ("new-plays") and measures held-out loss on the rest ("new-plays-heldout").
DERIVED_SPLITS = ("new-plays", "new-plays-heldout")
SPLITS = ("train", "val", *DERIVED_SPLITS)


def load_tokens(split: str = "train") -> np.memmap:
    """Token ids of `split`: "train" (first 90% of the corpus), "val" (the last 10%), or the fine-tuning
    slices of val: "new-plays" (its first 80%) and "new-plays-heldout" (the rest)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if split in DERIVED_SPLITS:
        val = load_tokens("val")
        cut = int(len(val) * NEW_PLAYS_TRAIN_FRACTION)
        return val[:cut] if split == "new-plays" else val[cut:]
    return np.memmap(training_file(split), dtype=np.uint16, mode="r")


def split_text(split: str = "train") -> str:
    """The raw text of `split`: the same characters, in the same place, as the tokens of load_tokens(split)
    (one token per character)."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    text = corpus_text()
    n_train = int(len(text) * (1 - VAL_FRACTION))
    return text[:n_train] if split == "train" else text[n_train:]
