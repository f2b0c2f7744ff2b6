"""The suite's time recorder (SCALEKIT_TEST_CPU_LOG in tests/conftest.py) and its summary (tools/suite_cpu.py)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

from tests.helpers import load_tool


def test_files_are_summed_and_ordered_by_cpu():
    rows = [{"id": "tests/a.py::x", "wall_s": 2.0, "own_cpu_s": 1.0, "children_cpu_s": 0.5, "worker": "gw0"},
            {"id": "tests/a.py::y", "wall_s": 1.0, "own_cpu_s": 0.25, "children_cpu_s": 0.0, "worker": "gw0"},
            {"id": "notebooks/n.ipynb::Cell 3", "wall_s": 0.1, "own_cpu_s": 0.0, "children_cpu_s": 6.0, "worker": "gw1"}]
    tool = load_tool("suite_cpu")
    assert tool.per_file(rows) == [("notebooks/n.ipynb", 6.0, 0.1, 1), ("tests/a.py", 1.75, 3.0, 2)]
    text = tool.report(rows, top=1)
    assert "3 tests on 2 worker(s): 8 CPU s" in text and "notebooks 6 CPU s (77%)" in text
    assert "tests/a.py::x" not in text  # --top 1: the costliest test only


def test_the_recorder_logs_a_line_per_test_with_its_childrens_cpu(tmp_path, monkeypatch):
    from tests import conftest

    log = tmp_path / "cpu.jsonl"
    monkeypatch.setattr(conftest, "_CPU_LOG", str(log))

    def recorded(nodeid, body):  # the hook around a test, as pytest drives a hookwrapper
        hook = conftest.pytest_runtest_protocol(SimpleNamespace(nodeid=nodeid), None)
        next(hook)
        body()
        with contextlib.suppress(StopIteration):
            hook.send(None)

    recorded("tests/t.py::test_child",
             lambda: subprocess.run([sys.executable, "-c", "sum(range(30_000_000))"], check=True))
    recorded("tests/t.py::test_nothing", lambda: None)
    rows = {r["id"]: r for r in map(json.loads, log.read_text().splitlines())}
    assert list(rows) == ["tests/t.py::test_child", "tests/t.py::test_nothing"]
    child, nothing = rows["tests/t.py::test_child"], rows["tests/t.py::test_nothing"]
    # the reaped child's CPU, where it ran (its sum alone takes several tenths of a second: far above the bound)
    assert child["children_cpu_s"] > 0.05 and nothing["children_cpu_s"] == 0
    assert child["wall_s"] >= child["children_cpu_s"] * 0.9 and all(r["own_cpu_s"] >= 0 for r in rows.values())


def test_the_summary_read_only_in_part_ends_quietly(tmp_path):
    """`python tools/suite_cpu.py LOG | head -3`: the closed pipe ends the tool without a traceback."""
    log = tmp_path / "cpu.jsonl"
    log.write_text("".join(json.dumps({"id": f"tests/t{i}.py::test_{i}", "wall_s": 1.0, "own_cpu_s": 1.0,
                                       "children_cpu_s": 0.0, "worker": "gw0"}) + "\n" for i in range(20_000)))
    tool = str(load_tool("suite_cpu").__file__)
    proc = subprocess.Popen([sys.executable, tool, str(log), "--top", "20000"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()  # as head does after its lines
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and first.startswith(b"20000 tests"), err
    assert "Traceback" not in err and err == ""


def test_the_busy_samples_say_the_machines_busy_share_and_its_cores(tmp_path):
    import threading

    from tests.conftest import busy_samples

    path, stop = tmp_path / "cpu.jsonl.busy", threading.Event()
    sampler = threading.Thread(target=busy_samples, args=(str(path), stop, 0.05))
    sampler.start()
    deadline = time.monotonic() + 30
    while (not path.exists() or len(path.read_text().splitlines()) < 3) and time.monotonic() < deadline:
        sum(range(200_000))  # keep a core busy meanwhile
    stop.set()
    sampler.join(timeout=10)
    assert not sampler.is_alive()
    tool = load_tool("suite_cpu")
    samples, cores = tool.read_busy(path)
    assert len(samples) >= 3 and cores == os.cpu_count()
    assert all(0 <= busy <= 1 for _, busy in samples) and [t for t, _ in samples] == sorted(t for t, _ in samples)


def test_idle_seconds_are_shared_among_the_tests_running_then():
    rows = [{"id": "tests/a.py::x", "start": 100.0, "wall_s": 4.0, "own_cpu_s": 1, "children_cpu_s": 0, "worker": "gw0"},
            {"id": "tests/b.py::y", "start": 100.0, "wall_s": 2.0, "own_cpu_s": 1, "children_cpu_s": 0, "worker": "gw1"},
            {"id": "tests/b.py::z", "start": 102.0, "wall_s": 2.0, "own_cpu_s": 1, "children_cpu_s": 0, "worker": "gw1"}]
    # each sample covers the second before it: at 101 x and y ran, at 103.5 x and z; each time one of the 2 cores
    # idled, shared between the two files.  The sample at 106 is after the last test and not counted.
    samples = [(101.0, 0.5), (102.0, 1.0), (103.5, 0.5), (104.0, 1.0), (106.0, 0.0)]
    text = load_tool("suite_cpu").busy_report(rows, samples, cores=2, top=5)
    assert text.startswith("machine busy 75.0% of the 4 s tests ran (4 samples, 2 cores): 2 idle core-s")
    assert "     1.0  tests/a.py" in text and "     1.0  tests/b.py" in text
    assert "no busy samples" in load_tool("suite_cpu").busy_report([{k: v for k, v in r.items() if k != "start"}
                                                                    for r in rows], samples, cores=2, top=5)
