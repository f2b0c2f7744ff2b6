"""Where results are written: every command that writes a file, against every kind of destination a user can
give (a symlink, a character device, a FIFO, standard output, a read-only folder, a full disk, a folder that
disappears mid-run).  The runs are stubs (the writing is the CLI's and scalekit.files'); results are never
lost, and every message names the path."""

from __future__ import annotations

import importlib
import json
import os
import stat
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import scalekit.cli.main
import scalekit.training.engine
from scalekit import files
from scalekit.cli.main import main
from scalekit.errors import ConfigError
from scalekit.inference.results import GenerateResult
from scalekit.training.results import RunResult

COMMANDS = {
    "bench": ["bench", "--preset", "tiny", "--device", "cpu"],
    "ladder": ["ladder", "--preset", "tiny", "--device", "cpu"],
    "generate": ["generate", "--device", "cpu"],
    "tune": ["tune", "--preset", "tiny", "--device", "cpu"],
}
ROOT = os.geteuid() == 0


class StubTune:
    """What autotune returns, as far as `scalekit tune` reads it."""

    def __init__(self, cfg):
        self.best = cfg

    def table(self):
        import pandas as pd

        return pd.DataFrame([{"change": "bf16", "kept": True}])

    def summary(self) -> str:
        return "chose baseline (stub)"

    def to_dict(self) -> dict:
        return {"best": self.best.to_dict(), "stub": True}


@pytest.fixture
def stub_runs(monkeypatch, tmp_path_factory):
    """Every command's work replaced by a stub that returns at once; `during` runs inside it (mid-run)."""
    during = SimpleNamespace(action=None)

    def act():
        if during.action is not None:
            during.action()

    def run(cfg, **kw):
        act()
        return RunResult(label="baseline", config=cfg.resolve(scalekit.detect("cpu")).to_dict(), status="ok")

    def ladder(base, **kw):
        act()
        return [RunResult(label="baseline", config={}, status="ok"), RunResult(label="+ bf16", config={}, status="ok")]

    def generate(cfg, **kw):
        act()
        return GenerateResult(label="baseline", config=cfg.to_dict(), status="ok", texts=["ROMEO: hi"])

    def autotune(cfg, **kw):
        act()
        return StubTune(cfg)

    monkeypatch.setattr(scalekit.training.engine, "run", run)
    monkeypatch.setitem(scalekit.cli.main.LADDERS, "train", ladder)
    monkeypatch.setattr(importlib.import_module("scalekit.inference"), "generate", generate)
    monkeypatch.setattr(importlib.import_module("scalekit.autotune"), "autotune", autotune)
    monkeypatch.setattr(files, "FIFO_READER_WAIT_S", 0.5)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path_factory.mktemp("kept")))  # where fallback copies go
    return during


def run_cli(command: str, path, capsys) -> tuple[int, str, str]:
    code = main([*COMMANDS[command], "--json", str(path)])
    out, err = capsys.readouterr()
    return code, out, err


def kept_copy(err: str) -> Path:
    """The fallback file a message points to ('... the results are kept in PATH')."""
    marker = "kept in "
    assert marker in err, err
    return Path(err.split(marker, 1)[1].split()[0].rstrip(".;,"))


def assert_one_line(err: str, *words: str) -> None:
    lines = [line for line in err.splitlines() if line.startswith("scalekit")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in lines[0], (word, err)


# -- the kinds of destination ----------------------------------------------------------------------------------
@pytest.mark.parametrize("command", COMMANDS)
def test_a_symlink_keeps_its_link_and_its_target_is_replaced(command, tmp_path, stub_runs, capsys):
    target = tmp_path / "real" / "r.json"
    target.parent.mkdir()
    target.write_text("stale")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    code, _, err = run_cli(command, link, capsys)
    assert code == 0, err
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads(target.read_text())  # the target holds the new results
    assert sorted(p.name for p in target.parent.iterdir()) == ["r.json"]  # no temporary left beside it


@pytest.mark.parametrize("command", COMMANDS)
def test_a_dangling_symlink_writes_its_target(command, tmp_path, stub_runs, capsys):
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "new.json")
    code, _, err = run_cli(command, link, capsys)
    assert code == 0, err
    assert link.is_symlink() and json.loads((tmp_path / "new.json").read_text())


def device_node(tmp_path, name: str, minor: int) -> Path:
    """/dev/null (minor 3) or /dev/full (minor 7), as a private node where we may make one (root): a test that
    failed must never replace the machine's own device with a regular file."""
    if ROOT:
        node = tmp_path / name
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
        return node
    if not os.path.exists(f"/dev/{name}"):
        pytest.skip(f"needs /dev/{name} (Linux)")
    return Path(f"/dev/{name}")  # not root: it cannot be replaced


@pytest.mark.parametrize("command", COMMANDS)
def test_dev_null_stays_a_device(command, tmp_path, stub_runs, capsys):
    node = device_node(tmp_path, "null", 3)
    code, _, err = run_cli(command, node, capsys)
    assert code == 0, err
    assert stat.S_ISCHR(os.stat(node).st_mode)


@pytest.mark.parametrize("command", COMMANDS)
def test_dev_full_stays_a_device_and_the_results_are_kept_elsewhere(command, tmp_path, stub_runs, capsys):
    node = device_node(tmp_path, "full", 7)
    code, out, err = run_cli(command, node, capsys)
    assert code == 1
    assert stat.S_ISCHR(os.stat(node).st_mode)
    assert_one_line(err, str(node), "kept in")
    assert json.loads(kept_copy(err).read_text())
    kept_copy(err).unlink()


@pytest.mark.parametrize("command", COMMANDS)
def test_a_fifo_with_a_reader_gets_the_json(command, tmp_path, stub_runs, capsys):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = {}

    def read():
        with open(fifo) as f:
            got["text"] = f.read()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    code, _, err = run_cli(command, fifo, capsys)
    reader.join(5)
    assert code == 0, err
    assert json.loads(got["text"]) and stat.S_ISFIFO(os.stat(fifo).st_mode)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_fifo_nobody_reads_does_not_hang_and_the_results_are_kept(command, tmp_path, stub_runs, capsys):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    code, _, err = run_cli(command, fifo, capsys)
    assert time.monotonic() - t0 < 5
    assert code == 1 and stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert_one_line(err, str(fifo), "kept in")
    assert json.loads(kept_copy(err).read_text())
    kept_copy(err).unlink()


@pytest.mark.parametrize("command", COMMANDS)
def test_a_dash_writes_the_json_to_stdout_and_the_table_to_stderr(command, stub_runs, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where a file named "-" would appear
    code, out, err = run_cli(command, "-", capsys)
    assert code == 0, err
    json.loads(out)  # nothing but the JSON on standard output
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("command", COMMANDS)
def test_a_folder_that_disappears_mid_run_keeps_the_results(command, tmp_path, stub_runs, capsys):
    folder = tmp_path / "out"
    folder.mkdir()
    stub_runs.action = lambda: folder.rmdir()
    code, out, err = run_cli(command, folder / "r.json", capsys)
    assert code == 1
    assert_one_line(err, str(folder / "r.json"), "kept in")
    assert json.loads(kept_copy(err).read_text())
    kept_copy(err).unlink()


@pytest.mark.parametrize("command", COMMANDS)
def test_a_full_disk_keeps_the_results(command, tmp_path, stub_runs, capsys, monkeypatch):
    real_fdopen = os.fdopen
    target = tmp_path / "r.json"

    class Full:  # a file whose writes fail as on a full disk, for files beside the target only
        def __init__(self, f):
            self.f = f

        def write(self, data):
            raise OSError(28, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def fdopen(fd, *args, **kwargs):
        f = real_fdopen(fd, *args, **kwargs)
        return Full(f) if os.path.dirname(os.readlink(f"/proc/self/fd/{fd}")) == str(tmp_path) else f

    monkeypatch.setattr(os, "fdopen", fdopen)
    code, out, err = run_cli(command, target, capsys)
    assert code == 1 and not target.exists()
    assert_one_line(err, str(target), "No space left", "kept in")
    assert [p.name for p in tmp_path.iterdir()] == []  # no temporary left behind
    assert json.loads(kept_copy(err).read_text())
    kept_copy(err).unlink()


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 64 KiB tmpfs (root only)."""
    if not ROOT:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def fill(folder: Path) -> None:
    """Write into `folder` until its file system is full."""
    with open(folder / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 1024)
                f.flush()
        except OSError:
            pass


@pytest.mark.parametrize("command", COMMANDS)
def test_a_really_full_disk_keeps_the_results(command, tiny_tmpfs, stub_runs, capsys):
    stub_runs.action = lambda: fill(tiny_tmpfs)  # room at the up-front check; full by the time results are written
    code, _, err = run_cli(command, tiny_tmpfs / "r.json", capsys)
    assert code == 1
    assert_one_line(err, str(tiny_tmpfs / "r.json"), "kept in")
    assert json.loads(kept_copy(err).read_text())
    kept_copy(err).unlink()
    assert sorted(p.name for p in tiny_tmpfs.iterdir()) == ["filler"]


@pytest.fixture
def read_only_folder(tmp_path):
    """A folder nobody can write in: a read-only tmpfs for root (who ignores permission bits), else chmod."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if not ROOT:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a read-only tmpfs here")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_read_only_folder_is_refused_before_any_work(command, read_only_folder, stub_runs, capsys):
    ran = []
    stub_runs.action = lambda: ran.append(1)
    code, _, err = run_cli(command, read_only_folder / "r.json", capsys)
    assert code == 2 and not ran
    assert_one_line(err, str(read_only_folder / "r.json"))


@pytest.mark.parametrize("path", ["/proc/r.json", "/sys/r.json"])
def test_a_pseudo_file_system_is_refused_before_any_work(path, stub_runs, capsys):
    if not os.path.isdir(os.path.dirname(path)):
        pytest.skip(f"no {os.path.dirname(path)} here")
    ran = []
    stub_runs.action = lambda: ran.append(1)
    code, _, err = run_cli("generate", path, capsys)
    assert code == 2 and not ran
    assert_one_line(err, path)


# -- scalekit.files, directly ----------------------------------------------------------------------------------------
def test_write_atomic_follows_a_chain_of_symlinks(tmp_path):
    target = tmp_path / "t.json"
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(target)
    files.write_text_atomic(tmp_path / "a", "new")
    assert target.read_text() == "new" and (tmp_path / "a").is_symlink() and (tmp_path / "b").is_symlink()


def test_a_symlink_loop_is_refused_naming_it(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(ConfigError, match=str(tmp_path / "a")):
        files.check_writable(tmp_path / "a")


def test_a_checkpoint_saved_through_a_symlink_keeps_the_link(tmp_path):
    import torch

    from scalekit.models import weight_files as checkpoint

    target = tmp_path / "w.pt"
    target.write_bytes(b"old")
    link = tmp_path / "latest.pt"
    link.symlink_to(target)
    checkpoint.save(torch.nn.Linear(2, 2), link)
    assert link.is_symlink() and target.stat().st_size > 100


def test_a_name_with_a_nul_character_is_refused_naming_it(stub_runs, capsys):
    code, _, err = run_cli("bench", "r\x00.json", capsys)
    assert code == 2
    assert_one_line(err, "NUL")


NAME_MAX = 255  # bytes in one file name, on the file systems Linux and macOS use


@pytest.mark.parametrize("command", COMMANDS)
def test_a_name_as_long_as_the_file_system_allows_is_written(command, tmp_path, stub_runs, capsys):
    # the temporary file beside it must fit too: a name built on the whole target name would be over the limit
    name = "r" * (NAME_MAX - len(".json")) + ".json"
    code, _, err = run_cli(command, tmp_path / name, capsys)
    assert code == 0, err
    assert json.loads((tmp_path / name).read_text())
    assert [p.name for p in tmp_path.iterdir()] == [name]  # no temporary or probe left beside it


def test_a_long_name_whose_write_fails_still_gets_a_fallback_copy(tmp_path, stub_runs, capsys):
    name = "r" * (NAME_MAX - len(".json")) + ".json"
    folder = tmp_path / "out"
    folder.mkdir()
    stub_runs.action = lambda: folder.rmdir()
    code, _, err = run_cli("bench", folder / name, capsys)
    assert code == 1
    assert_one_line(err, "kept in")
    assert json.loads(kept_copy(err).read_text())
    kept_copy(err).unlink()
