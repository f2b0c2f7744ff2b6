"""The shipped corpus' token cache where things go wrong: a full disk, a read-only folder, files deleted or
damaged while a notebook's kernel lives on, an empty XDG_CACHE_HOME, a writer killed mid-build."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest

from scalekit.data import shakespeare
from scalekit.errors import TokenCacheUnavailable
from scalekit.files import write_atomic
from scalekit.inference import generate
from tests.helpers import CPU, small_mount


def cache_on(folder: Path, monkeypatch) -> Path:
    monkeypatch.setenv("SCALEKIT_CACHE", str(folder))
    shakespeare._VALIDATED.clear()
    return folder


# -- a cache that cannot be written -----------------------------------------------------------------------------
def test_a_full_disk_names_the_cache_says_no_space_and_how_to_move_it(tmp_path, monkeypatch):
    with small_mount(tmp_path / "disk", size="256k") as disk:  # the cache needs about 2.2 MB
        folder = cache_on(disk / "cache", monkeypatch)
        with pytest.raises(TokenCacheUnavailable) as caught:
            shakespeare.load_tokens("train")
        message = str(caught.value)
        assert str(folder) in message and "no space left" in message and "SCALEKIT_CACHE" in message, message
        assert "requested and" not in message and "\n" not in message
        assert not list(folder.glob(".*.tmp"))  # the half-written file went with the failure


def test_a_read_only_cache_folder_says_so_and_names_scalekit_cache(tmp_path, monkeypatch):
    with small_mount(tmp_path / "ro", read_only=True) as disk:
        cache_on(disk, monkeypatch)
        with pytest.raises(TokenCacheUnavailable) as caught:
            shakespeare.load_tokens("val")
        message = str(caught.value)
        assert str(disk) in message and "read-only" in message and "SCALEKIT_CACHE" in message, message
        assert "Errno" not in message


def test_generate_keeps_its_generation_when_only_the_quality_cache_cannot_be_built(tmp_path, monkeypatch):
    with small_mount(tmp_path / "disk", size="256k") as disk:
        cache_on(disk / "cache", monkeypatch)
        result = generate(model="tiny", max_new_tokens=4, warmup_tokens=0, measure_memory=False, device="cpu",
                          hw=CPU, catch_errors=True)
    assert result.status == "ok", result.error
    assert len(result.token_ids[0]) == 4 and result.decode_tokens_per_s > 0
    assert result.perplexity is None and result.agreement is None
    note = next(n for n in result.notes if "quality not measured" in n)
    assert "no space left" in note and "SCALEKIT_CACHE" in note


# -- a cache changed while the process lives on (a long notebook session) ---------------------------------------
def _zeros_keeping_times(path: Path) -> None:
    """Zeros of the same size, its mtime set back as it was: only the inode's ctime still shows the write."""
    st = path.stat()
    path.write_bytes(b"\0" * st.st_size)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _replaced_by_other_tokens(path: Path) -> None:
    other = path.with_name("other.bin")
    other.write_bytes(bytes(reversed(path.read_bytes())))  # same size, other tokens, another inode
    os.replace(other, path)


@pytest.mark.parametrize("change", ["deleted", "zeros", "zeros, mtime set back", "replaced", "record deleted"])
def test_a_cache_deleted_or_damaged_during_the_session_is_rebuilt_at_the_next_open(fresh_cache, change, capsys):
    good = shakespeare.load_tokens("train").copy()  # checked and remembered by this process
    path = fresh_cache / "shakespeare_char_train.bin"
    if change == "deleted":
        path.unlink()
    elif change == "zeros":
        path.write_bytes(b"\0" * path.stat().st_size)
    elif change == "zeros, mtime set back":
        _zeros_keeping_times(path)
    elif change == "replaced":
        _replaced_by_other_tokens(path)
    else:
        (fresh_cache / "shakespeare_char.json").unlink()
    capsys.readouterr()
    again = shakespeare.load_tokens("train")  # the same process: no _VALIDATED.clear() here
    note = capsys.readouterr().err
    assert (again == good).all()
    assert note.count("\n") == 1 and "rebuilt the token cache" in note and str(fresh_cache) in note


def test_an_unchanged_cache_is_not_read_again_at_each_open(fresh_cache, monkeypatch):
    shakespeare.load_tokens("train")

    def read_again(meta):
        raise AssertionError("the cache's files were checked again though they did not change")

    monkeypatch.setattr(shakespeare, "_problem", read_again)
    assert len(shakespeare.load_tokens("train")) and len(shakespeare.load_tokens("val"))


# -- where the cache goes ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("xdg", ["", "relative/cache", "."])
def test_an_empty_or_relative_xdg_cache_home_means_unset(xdg, tmp_path, monkeypatch):
    monkeypatch.delenv("SCALEKIT_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", xdg)
    assert shakespeare.cache_dir() == tmp_path / "home" / ".cache" / "scalekit"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # an absolute one is used
    assert shakespeare.cache_dir() == tmp_path / "xdg" / "scalekit"


# -- a writer killed mid-build ----------------------------------------------------------------------------------
def _killed_while_writing(path: Path) -> None:
    def write(f):
        f.write(b"\1" * 4096)
        f.flush()
        os.kill(os.getpid(), signal.SIGKILL)  # nothing runs after this: no except, no finally

    write_atomic(path, write, binary=True)


def test_a_temporary_file_left_by_a_killed_writer_is_removed_by_a_later_build(fresh_cache):
    fresh_cache.mkdir()
    child = multiprocessing.get_context("fork").Process(
        target=_killed_while_writing, args=(fresh_cache / "shakespeare_char_train.bin",))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    (left,) = fresh_cache.glob(".shakespeare_char_train.bin.*.tmp")
    aged = time.time() - shakespeare.STALE_TEMP_AGE_S - 60
    os.utime(left, (aged, aged))  # as if the kill was a while ago
    busy = fresh_cache / ".shakespeare_char_val.bin.live.tmp"  # another process writing now: left alone
    busy.write_bytes(b"\1")
    shakespeare.load_tokens("train")
    assert not left.exists() and busy.exists()
