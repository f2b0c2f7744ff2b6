"""A user's data file read into a Hugging Face `datasets.Dataset`, one row per document, and a hash of its content.

The formats (FILE_FORMATS): `.jsonl` (one JSON object per line), `.json` (a list of objects, or one object whose
values are equal-length columns), `.parquet`, a folder written by `datasets.save_to_disk` (a DatasetDict: its
'train' split, or its only one), a `.txt` file (the whole file is one document, one stream of text as the shipped
corpus is) and a folder of `.txt` files (each file one document, in the order of their names).  Everything is
read in memory: nothing is written next to the user's files or into the Hugging Face cache.  What cannot be
read is refused (ConfigError) naming the file.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..errors import ConfigError
from ..files import expand_user
from ..optional import quiet_import
from .loaders import DATA_SOURCES

FILE_FORMATS = (".jsonl", ".json", ".parquet", ".txt")
FOLDER_FORMATS = ("a folder saved by datasets.save_to_disk", "a folder of .txt files")
SAVED_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")  # what save_to_disk writes
ALLOWED = f"{', '.join(FILE_FORMATS)}, {' or '.join(FOLDER_FORMATS)}"


def is_data_path(data: object) -> bool:
    """RunConfig.data names a file or folder, not one of the data sources (nor what a run resolves them to)."""
    return isinstance(data, str | os.PathLike) and data not in ("auto", "custom", "dataset", *DATA_SOURCES)


def path_exists(path: str | os.PathLike) -> bool:
    """Whether `path` names a file or folder (False also for a name no file system takes: empty, a NUL)."""
    try:
        return bool(os.fspath(path).strip()) and expand_user(path).exists()
    except (OSError, ValueError, RuntimeError):  # a NUL, a name too long, ~user of no user here
        return False


def data_format(path: str | os.PathLike) -> str:
    """The format of `path` ('jsonl', 'json', 'parquet', 'txt', 'save_to_disk' or 'txt_folder'), or a
    ConfigError naming the file and the formats allowed."""
    p = expand_user(path)
    if p.is_dir():
        if any((p / name).is_file() for name in SAVED_MARKERS):
            return "save_to_disk"
        if any(p.glob("*.txt")):
            return "txt_folder"
        raise ConfigError(f"RunConfig.data: the folder {str(p)!r} is neither saved by datasets.save_to_disk (no "
                          f"{', '.join(SAVED_MARKERS)}) nor a folder of .txt files; allowed: {ALLOWED}")
    if not p.exists():
        raise ConfigError(f"RunConfig.data: no file or folder {str(p)!r}")
    if p.suffix.lower() not in FILE_FORMATS:
        raise ConfigError(f"RunConfig.data: {str(p)!r} has the unknown extension {p.suffix or '(none)'!r}; "
                          f"allowed: {ALLOWED}")
    if not os.access(p, os.R_OK):
        raise ConfigError(f"RunConfig.data: {str(p)!r} cannot be read (permission denied)")
    return p.suffix.lower()[1:]


def _files_of(path: Path) -> list[Path]:
    return sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]


def content_hash(path: str | os.PathLike) -> str:
    """sha256 of the file's bytes; of a folder: of each of its files' relative name and bytes, in name order."""
    p = expand_user(path)
    digest = hashlib.sha256()
    for f in _files_of(p):
        digest.update(str(f.relative_to(p) if p.is_dir() else f.name).encode("utf-8") + b"\0")
        try:
            with open(f, "rb") as stream:
                for chunk in iter(lambda: stream.read(1 << 20), b""):  # noqa: B023 (read now, in this loop)
                    digest.update(chunk)
        except OSError as exc:
            raise ConfigError(f"RunConfig.data: {str(f)!r} cannot be read ({exc.strerror or exc})") from None
    return digest.hexdigest()


def datasets_library():
    try:
        return quiet_import("datasets")
    except ImportError as exc:
        raise ConfigError("RunConfig.data: reading a data file needs the datasets library: pip install datasets") \
            from exc


def read_rows(path: str | os.PathLike):
    """The file as a datasets.Dataset, one row per document (in memory)."""
    p = expand_user(path)
    fmt = data_format(p)
    datasets = datasets_library()
    try:
        if fmt == "jsonl":
            return datasets.Dataset.from_list(_jsonl_rows(p))
        if fmt == "json":
            return _json_rows(datasets, p)
        if fmt == "parquet":
            pq = quiet_import("pyarrow.parquet")
            return datasets.Dataset(pq.read_table(p))
        if fmt == "save_to_disk":
            return _saved_rows(datasets, p)
        texts = [p.read_text(encoding="utf-8")] if fmt == "txt" else \
            [f.read_text(encoding="utf-8") for f in sorted(p.glob("*.txt"))]
        return datasets.Dataset.from_dict({"text": texts})
    except ConfigError:
        raise
    except (OSError, ValueError, TypeError) as exc:  # also pyarrow's errors (ArrowInvalid is a ValueError)
        raise ConfigError(f"RunConfig.data: {str(p)!r} cannot be read as {fmt}: {str(exc).splitlines()[0]}") from None


def _jsonl_rows(path: Path) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise ConfigError(f"RunConfig.data: {str(path)!r} line {number} is not JSON ({exc})") from None
            if not isinstance(row, dict):
                raise ConfigError(f"RunConfig.data: {str(path)!r} line {number} is a {type(row).__name__}, not "
                                  f"a JSON object (one object per line, e.g. {{\"text\": ...}})")
            rows.append(row)
    return rows


def _json_rows(datasets, path: Path):
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ConfigError(f"RunConfig.data: {str(path)!r} is not JSON ({exc}); a file of one JSON object per "
                          f"line is a .jsonl") from None
    if isinstance(data, list) and all(isinstance(row, dict) for row in data):
        return datasets.Dataset.from_list(data)
    if isinstance(data, dict) and all(isinstance(v, list) for v in data.values()):
        return datasets.Dataset.from_dict(data)
    raise ConfigError(f"RunConfig.data: {str(path)!r} holds neither a list of objects nor an object of columns "
                      f"(lists of equal length)")


def _saved_rows(datasets, path: Path):
    saved = datasets.load_from_disk(str(path), keep_in_memory=True)
    if isinstance(saved, datasets.DatasetDict):
        if "train" in saved:
            return saved["train"]
        if len(saved) != 1:
            raise ConfigError(f"RunConfig.data: {str(path)!r} holds the splits {', '.join(saved)}: scalekit reads "
                              f"'train' or a single split")
        return next(iter(saved.values()))
    return saved
