"""`scalekit launch` and the torchrun command lines scalekit prints.

One node: the ranks start on this machine's loopback rendezvous (the same one `scalekit.launch` uses).
Several nodes: torchrun itself runs, with the static rendezvous — node 0 hosts the store at
--rdzv-endpoint, every node runs the same command with its own --node-rank.  `torchrun_command` gives the
exact line to run on each machine, for a script or for a RunConfig (which becomes `scalekit bench`).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import shlex
import signal
import sys
import threading

from ..errors import ConfigError

LOOPBACK_RDZV = ("--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0", "--local-addr=127.0.0.1")
INTERRUPTED_EXIT = 130  # 128 + SIGINT: what a shell reports for a command ended by Ctrl-C


def torchrun_command(target, *, nproc_per_node: int = 1, nnodes: int = 1, node_rank: int = 0,
                     rdzv_endpoint: str | None = None, args=(), module: bool = False) -> list[str]:
    """The torchrun argv that runs `target` (a script path, a module with module=True, or a RunConfig)."""
    from ..training.config import RunConfig

    if isinstance(target, RunConfig):
        target, args, module = "scalekit.cli.main", ["bench", *bench_args(target), *args], True
    _check_positive("nproc_per_node", nproc_per_node)
    _check_positive("nnodes", nnodes)
    cmd = ["torchrun", f"--nproc-per-node={nproc_per_node}"]
    if nnodes == 1 and rdzv_endpoint is None:
        cmd += LOOPBACK_RDZV  # like --standalone, but every address is 127.0.0.1
    else:
        host, _, port = (rdzv_endpoint or "").rpartition(":")
        if not host or not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            raise ConfigError(f"rdzv_endpoint must be HOST:PORT of node 0 (reachable from every node; a port from "
                              f"1 to 65535), got {rdzv_endpoint!r} (with nnodes {nnodes})")
        if isinstance(node_rank, bool) or not isinstance(node_rank, int) or not 0 <= node_rank < nnodes:
            raise ConfigError(f"node_rank must be an integer from 0 to nnodes-1 ({nnodes - 1}), got {node_rank!r}")
        cmd += [f"--nnodes={nnodes}", f"--node-rank={node_rank}", "--rdzv-backend=static",
                f"--rdzv-endpoint={rdzv_endpoint}"]
    cmd += ["-m", target] if module else [target]
    return cmd + [str(a) for a in args]


def bench_args(cfg) -> list[str]:
    """`scalekit bench` flags for a RunConfig, derived from its fields as the command line's flags are
    (scalekit.cli.fields): every field away from its default is carried, and one no flag can carry is refused."""
    from ..cli.fields import NO_COUNTERPART, field_flags
    from ..training.config import RunConfig

    if cfg.custom_model:
        raise ConfigError("RunConfig.model: your own model cannot be passed on a command line; launch a script "
                          "that builds it (scalekit launch script.py) instead")
    default = RunConfig()
    said_elsewhere = ("label", "notes")  # a row's name and what made the config: not what runs
    for name in (key.split(".")[1] for key in NO_COUNTERPART if key.startswith("RunConfig.")):
        if name not in said_elsewhere and getattr(cfg, name) != getattr(default, name):
            raise ConfigError(f"RunConfig.{name} has no `scalekit bench` flag ({NO_COUNTERPART['RunConfig.' + name]}); "
                              f"launch a script instead")
    out: list = []
    for spec in field_flags(RunConfig):
        value = getattr(cfg, spec.options["dest"])
        if value == spec.options["default"]:
            continue
        out += [spec.flag] if "action" in spec.options else [spec.flag, value]
    for name, value in cfg.toggles.items():
        out += ["--toggle", name if value is True else f"{name}={value}"]
    return [str(x) for x in out]


def check_nproc_flag(value, default: str = "one per GPU, or 2 on a CPU machine") -> int | None:
    """--nproc-per-node as given (None: the default), refused with one line when it is not a positive count."""
    if value is not None and value < 1:
        raise ConfigError(f"--nproc-per-node must be a positive integer (the processes to start: 1, 2, ...), "
                          f"got {value}; leave it out for the default ({default})")
    return value


def check_timeout_flag(value) -> float | None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ConfigError(f"--timeout-s must be a positive number of seconds (e.g. 600), got {value:g}; leave it "
                          f"out for no limit")
    return value


@contextlib.contextmanager
def ctrl_c_raises():
    """Ctrl-C raises KeyboardInterrupt in here, once the launcher has stopped every rank, in place of the
    CLI's "stop after this step" handler, which a launch cannot honour."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler) if main else None
    try:
        yield
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)


def interrupted(prog: str) -> int:
    """The one line a launch ended by Ctrl-C prints, and the exit code a shell expects."""
    print(f"{prog}: interrupted; every rank was stopped", file=sys.stderr, flush=True)
    return INTERRUPTED_EXIT


def _check_positive(name, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("launch", help="run a script in several processes (this machine, or several nodes)",
                       description="Run SCRIPT in --nproc-per-node processes on torch.distributed.  One node: "
                                   "loopback rendezvous on a free port.  Several nodes: run the same command "
                                   "on every node with its own --node-rank; node 0 hosts --rdzv-endpoint.")
    p.add_argument("--nproc-per-node", type=int, default=None,
                   help="processes on this node (default: one per GPU, or 2 on a CPU machine)")
    p.add_argument("--nnodes", type=int, default=1, help="number of machines (default 1)")
    p.add_argument("--node-rank", type=int, default=0, help="this machine's index, 0 … nnodes-1")
    p.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT",
                   help="node 0's address and a free port on it (needed with --nnodes > 1)")
    p.add_argument("--timeout-s", type=float, default=None, metavar="S",
                   help="stop every process after S seconds and say which were still running (one node; "
                        "default: no limit)")
    p.add_argument("--keep-logs", action="store_true",
                   help="keep the folder of the processes' output (its path is printed); default: removed")
    p.add_argument("--print-torchrun", action="store_true",
                   help="print the equivalent torchrun command line and exit")
    p.add_argument("-m", "--module", action="store_true", help="SCRIPT is a module, as in python -m")
    p.add_argument("target", metavar="SCRIPT", help="the script (or module, with -m) every process runs")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    return p


def run_command(args) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from . import guards
    from .api import launch_script
    from .failure_report import LaunchError

    nproc = check_nproc_flag(args.nproc_per_node) or guards.default_nprocs()
    timeout_s = check_timeout_flag(args.timeout_s)
    one_node = args.nnodes == 1 and args.rdzv_endpoint is None
    if not one_node and (timeout_s is not None or args.keep_logs):
        raise ConfigError("--timeout-s and --keep-logs apply to launches on this machine only; with several "
                          "nodes torchrun runs the processes (give init_process_group a timeout in the script; "
                          "torchrun's --log-dir keeps the logs)")
    try:
        cmd = torchrun_command(args.target, nproc_per_node=nproc, nnodes=args.nnodes, node_rank=args.node_rank,
                               rdzv_endpoint=args.rdzv_endpoint, args=args.args, module=args.module)
    except ConfigError as exc:  # said in the words of the command line: its flags, not the arguments' names
        raise ConfigError(FLAG_WORDS.sub(lambda m: "--" + m.group(0).replace("_", "-"), str(exc))) from None
    if args.print_torchrun:
        print(shlex.join(cmd))
        return 0
    try:
        with ctrl_c_raises():
            if one_node:
                return launch_script(args.target, args.args, nprocs=nproc, module=args.module, timeout_s=timeout_s,
                                     keep_logs=args.keep_logs)
            return run_torchrun(cmd)
    except LaunchError as exc:
        print(f"scalekit launch: {exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, SignalException) as exc:
        # the launcher's SignalException, or the CLI's KeyboardInterrupt that keeps its signal (before the launcher)
        signum = signal.Signals(getattr(exc, "sigval", None) or getattr(exc, "signum", signal.SIGINT))
        if signum != signal.SIGINT:  # SIGTERM, SIGHUP: as a shell says
            print(f"scalekit launch: stopped by {signum.name}; every rank was stopped", file=sys.stderr)
            return 128 + signum
        return interrupted("scalekit launch")


FLAG_WORDS = re.compile(r"\b(nproc_per_node|nnodes|node_rank|rdzv_endpoint)\b")


def run_torchrun(cmd: list[str]) -> int:
    """Run a torchrun argv in this process, every output line prefixed with its global rank."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser
    from torch.distributed.run import run as torchrun

    os.environ.setdefault("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[rank${rank}]: ")
    nproc = int(next(a for a in cmd if a.startswith("--nproc-per-node=")).split("=")[1])
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    try:
        torchrun(get_args_parser().parse_args(["--tee=3", *cmd[1:]]))
    except ChildFailedError as exc:
        print(f"scalekit launch: {exc.format_msg()}", file=sys.stderr)
        return 1
    return 0
