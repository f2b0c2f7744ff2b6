"""The torch behaviour scalekit.launch relies on that torch does not document (scalekit/launch/torch_hooks.py),
checked against the installed torch: a failure names the hook and the torch version, so an upgrade that
breaks one says which, instead of a launch hanging or a rank failing to bind its port."""

from __future__ import annotations

import dataclasses
import datetime
import inspect
import signal
import sys
import threading

import pytest
import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing import LogsDest, PContext, start_processes

from scalekit.launch.agent import LoopbackStore, RankLogs
from scalekit.launch.run_files import RunFiles
from scalekit.launch.signals import AGENT_SIGNALS
from scalekit.launch.torch_hooks import (
    FORKS_IN_CALLER,
    PRIVATE_TORCH_HOOKS,
    SIGNALS_TO_HANDLE,
    USE_AGENT_STORE,
)


def broken(hook: str, what: str) -> str:
    return (f"torch {torch.__version__} no longer behaves as scalekit.launch expects of {hook} "
            f"(PRIVATE_TORCH_HOOKS in scalekit/launch/torch_hooks.py): {what}")


def check_use_agent_store(monkeypatch, tmp_path):
    """Rank 0's env:// rendezvous joins the launcher's store as a client; without the hook it would try to
    listen on MASTER_PORT itself and fail with "address already in use"."""
    store = LoopbackStore()
    try:
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port), "RANK": "0", "WORLD_SIZE": "2",
               USE_AGENT_STORE: "True"}
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        try:
            client, rank, world_size = next(dist.rendezvous("env://", timeout=datetime.timedelta(seconds=10)))
        except Exception as exc:  # noqa: BLE001 - any failure here is the hook breaking
            pytest.fail(broken(USE_AGENT_STORE, f"rank 0 did not join the launcher's store: {exc}"))
        client.set("hook", "seen")
        assert (rank, world_size) == (0, 2) and store.store.get("hook") == b"seen", broken(
            USE_AGENT_STORE, "rank 0 joined some other store than the launcher's")
    finally:
        store.close()


def check_signals_to_handle(monkeypatch, tmp_path):
    """An empty list: PContext.start installs no handler of its own (the agent starts ranks just so)."""
    monkeypatch.setenv(SIGNALS_TO_HANDLE, "")
    before = {s: signal.getsignal(s) for s in AGENT_SIGNALS}
    files = RunFiles(tmp_path)
    files.touch_logs(1)
    pcontext = None
    try:
        pcontext = start_processes(name="probe", entrypoint=sys.executable, args={0: ("-c", "pass")}, envs={0: {}},
                                   logs_specs=RankLogs(files, redirect=True))
        installed = [s.name for s in AGENT_SIGNALS if signal.getsignal(s) is not before[s]]
    finally:
        if pcontext is not None:
            pcontext.close(signal.SIGTERM, 5)
        for s, handler in before.items():
            signal.signal(s, handler)
    assert not installed, broken(SIGNALS_TO_HANDLE, f"an empty list still installs torch's handlers for {installed}")


def _forking_thread() -> str:
    return threading.current_thread().name  # a forked child keeps the Thread of the thread that forked it


def check_forks_in_caller(monkeypatch, tmp_path):
    """A rank started from a thread of the launcher's was forked by that very thread."""
    monkeypatch.setenv(SIGNALS_TO_HANDLE, "")
    files = RunFiles(tmp_path)
    files.touch_logs(1)
    seen = {}

    def start():
        pcontext = start_processes(name="probe", entrypoint=_forking_thread, args={0: ()}, envs={0: {}},
                                   start_method="fork", logs_specs=RankLogs(files, redirect=False))
        try:
            seen["result"] = pcontext.wait(timeout=30, period=0.05)
        finally:
            pcontext.close(signal.SIGTERM, 5)

    caller = threading.Thread(target=start, name="scalekit-probe-caller")
    caller.start()
    caller.join(60)
    result = seen.get("result")
    assert result is not None and not result.is_failed(), f"the probe rank did not return: {result}"
    assert result.return_values == {0: caller.name}, broken(
        FORKS_IN_CALLER, f"the rank was forked by the thread {result.return_values[0]!r}, not the caller")


CHECKS = {USE_AGENT_STORE: check_use_agent_store, SIGNALS_TO_HANDLE: check_signals_to_handle,
          FORKS_IN_CALLER: check_forks_in_caller}


def test_every_private_hook_has_a_check_and_says_why():
    assert set(CHECKS) == set(PRIVATE_TORCH_HOOKS), "add a check here for each entry of PRIVATE_TORCH_HOOKS"
    assert all(len(why) > 80 for why in PRIVATE_TORCH_HOOKS.values())


@pytest.mark.parametrize("hook", sorted(CHECKS))
def test_private_torch_hook_still_holds(hook, monkeypatch, tmp_path):
    CHECKS[hook](monkeypatch, tmp_path)


def test_the_public_elastic_api_the_agent_calls_still_takes_its_arguments():
    """Public, but the agent is written against these parameters: say which one went, if one does."""
    used = {start_processes: ("name", "entrypoint", "args", "envs", "logs_specs", "log_line_prefixes",
                              "start_method"),
            PContext.wait: ("timeout",), PContext.close: ("death_sig", "timeout")}
    for fn, names in used.items():
        missing = set(names) - set(inspect.signature(fn).parameters)
        assert not missing, f"torch {torch.__version__}: {fn.__qualname__} no longer takes {sorted(missing)}"
    fields = {f.name for f in dataclasses.fields(LogsDest)}
    assert {"stdouts", "stderrs", "tee_stdouts", "tee_stderrs", "error_files"} <= fields, (
        f"torch {torch.__version__}: LogsDest's fields are now {sorted(fields)}")
    assert callable(PContext.pids)
