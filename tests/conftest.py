import atexit
import contextlib
import json
import os
import resource
import shutil
import signal
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
# Hugging Face models are built from configs: nothing in the tests may reach for the Hub
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Under pytest-xdist (scripts/test.sh runs one worker per core) every worker computes on its share of the cores:
# two workers with torch's default of one thread per core would each wait on the other's threads.  The variable
# reaches what the workers start too (notebook kernels, forked ranks, CLI subprocesses).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _SHARE = str(max(1, (os.cpu_count() or 1) // _WORKERS))
    os.environ["OMP_NUM_THREADS"] = _SHARE
    torch.set_num_threads(int(_SHARE))
    # inductor's compile pool likewise: by default one fresh interpreter per core, started by every process that
    # compiles (each importing torch), which costs a process with one core's share more than it can gain
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", _SHARE)

# Every kernel inductor compiles for the CPU is a g++ run that first loads a 150 MB precompiled header; without the
# line tables for profilers (-g1, which no test reads) the header is 5% smaller and the 18 kernels of the
# tiny GPT's training step compiled 3-8% faster (measured one after another, each run's header already built).
os.environ.setdefault("AOT_INDUCTOR_ENABLE_LINE_TABLES", "0")


# The notebook kernels nbval starts read their IPython profile from a folder of the tests' own: nothing from the
# user's profile reaches them, and one startup line spares each kernel 1.8 s of the 31 it starts.  plotly imports
# nbformat, whose jsonschema builds rfc3987_syntax's IRI grammar at import; no notebook validates an IRI, and
# jsonschema without that optional package simply has no "iri" format checker.
_IPYTHON_DIR = tempfile.mkdtemp(prefix="scalekit-tests-ipython-")
atexit.register(shutil.rmtree, _IPYTHON_DIR, ignore_errors=True)
_STARTUP = Path(_IPYTHON_DIR, "profile_default", "startup")
_STARTUP.mkdir(parents=True)
(_STARTUP / "00_no_iri_grammar.py").write_text('import sys\nsys.modules.setdefault("rfc3987_syntax", None)\n')
os.environ["IPYTHONDIR"] = _IPYTHON_DIR


# The test files that fork ranks live in these folders of tests/ (and only there): the suite runs them first (see
# pytest_collection_modifyitems).  A new test that forks ranks goes in one of them.
FORKING_FOLDERS = tuple(Path(__file__).parent / name for name in ("launch", "distributed"))


def forks_ranks(path: Path) -> bool:
    """Whether the test file at `path` is one of the forking test files (under tests/launch or tests/distributed)."""
    return any(folder in path.parents for folder in FORKING_FOLDERS)


# nbval's kernels are forked from a server that has already imported torch, scalekit, plotly and transformers
# (tests/preloaded_kernel.py says how, and what a kernel still gets fresh): each notebook's kernel
# would otherwise spend 4-9 s of CPU importing them again.  SCALEKIT_TEST_PLAIN_KERNELS=1 runs plain kernels.
_KERNEL_SERVER: dict = {}


def _start_kernel_server() -> None:
    import subprocess

    import nbval.kernel

    folder = tempfile.mkdtemp(prefix="sk-kernels-")
    socket_path = os.path.join(folder, "server.sock")
    script = str(Path(__file__).with_name("preloaded_kernel.py"))
    with open(os.path.join(folder, "server.log"), "wb") as log:  # the server detaches: this returns at once
        subprocess.run([sys.executable, script, "serve", socket_path, str(os.getpid())], stdin=subprocess.DEVNULL,
                       stdout=log, stderr=subprocess.STDOUT, check=True)
    pid_file = Path(socket_path + ".pid")
    deadline = time.monotonic() + 30
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    if not pid_file.exists():
        return  # plain kernels, as without the server
    pid = int(pid_file.read_text())
    _KERNEL_SERVER.update(pid=pid, folder=folder)
    plain = nbval.kernel.NbvalKernelspecManager.get_kernel_spec

    def get_kernel_spec(self, kernel_name):
        spec = plain(self, kernel_name)
        if kernel_name != "python3":
            return spec
        spec.argv = [sys.executable, script, "launch", socket_path, "-f", "{connection_file}"]
        spec.env = {**spec.env, "SCALEKIT_TEST_KERNEL_SERVER_PID": str(pid)}
        spec.interrupt_mode = "signal"
        return spec

    nbval.kernel.NbvalKernelspecManager.get_kernel_spec = get_kernel_spec


def _stop_kernel_server() -> None:
    pid = _KERNEL_SERVER.get("pid")
    if pid is None:
        return
    if _CPU_LOG:  # the server's imports, on no test's account
        _log_cpu({"id": "tests/preloaded_kernel.py::server", "wall_s": 0.0, "own_cpu_s": 0.0,
                  "children_cpu_s": _kernel_server_cpu_s(own=True), "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")})
    del _KERNEL_SERVER["pid"]
    import signal

    from tests.preloaded_kernel import alive

    for signum in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        if not alive(pid):
            break
    shutil.rmtree(_KERNEL_SERVER.pop("folder"), ignore_errors=True)


def pytest_collection_finish(session):
    uses_nbval = session.config.pluginmanager.hasplugin("nbval") and not (
        session.config.getoption("nbval_kernel_name", None) or session.config.getoption("current_env", False))
    if (uses_nbval and os.environ.get("SCALEKIT_TEST_PLAIN_KERNELS") != "1"
            and any(item.path.suffix == ".ipynb" for item in session.items)):
        _start_kernel_server()


def pytest_sessionfinish(session, exitstatus):
    _stop_kernel_server()


def pytest_collection_modifyitems(config, items):
    # Tests that fork ranks go first: scalekit.launch rightly refuses to fork once this process has imported
    # bitsandbytes or initialised CUDA, which later tests (8-bit optimizers, GPU runs) do.
    items.sort(key=lambda item: not forks_ranks(item.path))  # stable: order kept within
    if "bitsandbytes" in sys.modules and any(forks_ranks(item.path) for item in items):
        raise pytest.UsageError("a test module imported bitsandbytes while being collected (peft, transformers' "
                                "TrainingArguments and TrainerCallback import it too), so the forking tests "
                                "cannot fork: import those inside the tests that use them")
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; this machine has none (torch sees no CUDA device)")
    skip_multi = pytest.mark.skip(reason="needs two or more CUDA GPUs")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)
        if "multi_gpu" in item.keywords and (not HAS_CUDA or torch.cuda.device_count() < 2):
            item.add_marker(skip_multi)


def _library_state() -> dict:
    """What a test must leave as it found it: torch's compiler configuration (dynamo's and, once imported,
    inductor's), its float32 matmul precision, default dtype, grad mode and intra-op threads."""
    state = {"matmul_precision": torch.get_float32_matmul_precision(), "default_dtype": torch.get_default_dtype(),
             "grad_enabled": torch.is_grad_enabled(), "threads": torch.get_num_threads()}
    for name in ("torch._dynamo.config", "torch._inductor.config"):
        if (config := sys.modules.get(name)) is not None:
            state[name] = config.get_config_copy()
    return state


@pytest.fixture
def library_state():
    return _library_state


@pytest.fixture(autouse=True)
def _library_state_kept():
    """Fails a test after which a library's global state differs from before it (a config patched and not
    restored, or restored by deletion, which hides a torch setting for the rest of the process)."""
    before = _library_state()
    yield
    after = _library_state()
    changed = sorted(key for key in before if after.get(key) != before[key] and not isinstance(before[key], dict))
    for name in ("torch._dynamo.config", "torch._inductor.config"):
        old, new = before.get(name), after.get(name)
        if old is not None and new is not None:
            changed += [f"{name}.{key}" for key in sorted(old.keys() | new.keys()) if old.get(key, _MISSING) != new.get(key, _MISSING)]
    if changed:
        pytest.fail(f"this test left library state changed: {', '.join(changed)}; patch torch's config with "
                    "torch._inductor.config.patch(...) / torch._dynamo.config.patch(...), and restore what it set",
                    pytrace=False)


_MISSING = object()
_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


@pytest.fixture(autouse=True)
def _signal_handlers_kept(request):
    """A test that leaves a signal's handler changed is named in a warning, and the handler put back: a SIGINT left
    ignored is inherited by every process a later test starts, whose Ctrl-C then reaches nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.getsignal(s) for s in _SIGNALS}
    yield
    for s, handler in before.items():
        now = signal.getsignal(s)
        if now is not handler:
            signal.signal(s, handler)
            warnings.warn(f"{request.node.nodeid} left {signal.Signals(s).name}'s handler changed ({now!r}, was "
                          f"{handler!r}); put back", UserWarning, stacklevel=1)


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty token cache of the test's own (SCALEKIT_CACHE), with the process's memo of checked caches cleared."""
    from scalekit.data import shakespeare

    monkeypatch.setenv("SCALEKIT_CACHE", str(tmp_path / "cache"))
    shakespeare._VALIDATED.clear()
    yield tmp_path / "cache"
    shakespeare._VALIDATED.clear()


@pytest.fixture(scope="module")
def raw_batches():
    """The raw data source's first batches at tests.helpers.SHAPES: what the data toggles must give batch for batch."""
    from tests.helpers import SHAPES, batches, tiny

    return batches(tiny(**SHAPES))


@pytest.fixture
def eager_compile(monkeypatch):
    """torch.compile on dynamo's eager backend: the wiring of every compile mode, without inductor's kernels (each a
    g++ run of most of a second); the tests that use it compile with inductor once, elsewhere."""
    real = torch.compile

    def eager(model=None, **kwargs):  # (libraries also call torch.compile as a decorator factory)
        kwargs.pop("mode", None)
        kwargs["backend"] = "eager"
        return real(model, **kwargs) if model is not None else real(**kwargs)

    monkeypatch.setattr(torch, "compile", eager)


@pytest.fixture(autouse=True, scope="session")
def _scalekit_cache(tmp_path_factory):
    # tokenized corpus goes to a per-session folder unless the caller chose one
    if "SCALEKIT_CACHE" not in os.environ:
        os.environ["SCALEKIT_CACHE"] = str(tmp_path_factory.mktemp("scalekit-cache"))
    yield


# Where the suite's time goes: with SCALEKIT_TEST_CPU_LOG=FILE, every test appends one JSON line to FILE, its wall
# seconds and the CPU seconds of its process and of the children it reaped (notebook kernels, CLI and benchmark
# subprocesses, forked ranks, inductor's compiler runs), with its start time; under xdist, FILE.busy gets the
# machine's busy share once a second.  `python tools/suite_cpu.py FILE` sums them per file.
_CPU_LOG = os.environ.get("SCALEKIT_TEST_CPU_LOG")


def _cpu_s() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime + _kernel_server_cpu_s()


def _kernel_server_cpu_s(own: bool = False) -> float:
    """The CPU of the kernels the kernel server has reaped (the server itself is reaped only at the end), or with
    `own`, the server's own (its imports, once)."""
    from tests.preloaded_kernel import proc_stat

    fields = proc_stat(_KERNEL_SERVER["pid"]) if "pid" in _KERNEL_SERVER else None
    if fields is None:
        return 0.0
    utime, stime, cutime, cstime = (int(value) for value in fields[11:15])  # proc(5) fields 14-17
    return (utime + stime if own else cutime + cstime) / os.sysconf("SC_CLK_TCK")


def _wait_for_a_stopped_kernel(item) -> None:
    """nbval kills a notebook's kernel at its last cell; the server reaps that kernel a moment later.  Wait for
    it (2 s at most), so that the kernel's CPU lands on its own notebook and not on the next test."""
    pid, kernel = _KERNEL_SERVER.get("pid"), getattr(getattr(item, "parent", None), "kernel", None)
    if pid is None or kernel is None or kernel.is_alive():
        return
    import psutil

    deadline = time.monotonic() + 2
    with contextlib.suppress(psutil.NoSuchProcess):
        while psutil.Process(pid).children() and time.monotonic() < deadline:
            time.sleep(0.02)


def busy_samples(path: str, stop, interval_s: float = 1.0) -> None:
    """Append to `path`, every `interval_s` until `stop` is set, the wall time, the share of the machine's cores
    that were busy since the last sample (from /proc/stat) and the cores: `tools/suite_cpu.py` sets them beside
    the tests' start times, to say how busy the machine was while they ran and which tests it idled under."""
    def read() -> tuple[int, int]:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:]]
        return sum(ticks), ticks[3] + ticks[4]  # all, idle + iowait

    total0, idle0 = read()
    while not stop.wait(interval_s):
        total1, idle1 = read()
        with open(path, "a") as f:
            f.write(f"{time.time():.2f} {1 - (idle1 - idle0) / max(1, total1 - total0):.3f} {os.cpu_count()}\n")
        total0, idle0 = total1, idle1


def pytest_configure(config):
    # one sampler, in the process of xdist's that runs no test (a thread in a test process could be forked)
    if _CPU_LOG and not hasattr(config, "workerinput") and config.getoption("numprocesses", None):
        import threading

        stop = threading.Event()
        config.add_cleanup(stop.set)
        threading.Thread(target=busy_samples, args=(_CPU_LOG + ".busy", stop), name="busy-samples",
                         daemon=True).start()


def _log_cpu(line: dict) -> None:
    with open(_CPU_LOG, "a") as f:  # one short line per write: the workers' lines do not interleave
        f.write(json.dumps(line) + "\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not _CPU_LOG:
        yield
        return
    (own0, children0), wall0, start = _cpu_s(), time.perf_counter(), time.time()
    yield
    _wait_for_a_stopped_kernel(item)
    (own1, children1), wall1 = _cpu_s(), time.perf_counter()
    _log_cpu({"id": item.nodeid, "start": round(start, 3), "wall_s": wall1 - wall0, "own_cpu_s": own1 - own0,
              "children_cpu_s": children1 - children0, "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")})


def pytest_unconfigure(config):
    # the last hook: what the interpreter then does at exit is pass over every object torch, transformers, peft,
    # plotly and pandas made, looking for cycles; frozen, it skips them (measured: 2.5 s less from the last test to
    # the command's end, on 2 workers).  atexit handlers still run (this file's own among them).
    import gc

    gc.freeze()
