"""The input pipeline as the training loop sees it: batches from a DataLoader copied to the device, counted,
and a way to end the DataLoader's worker processes when the run ends, however it ends."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import torch
from torch.utils._pytree import tree_map
from torch.utils.data import DataLoader

from ..errors import DataWorkerDied

DEAD_WORKER_WAIT_S = 1.0  # how long a failed fetch waits for a dying worker's exit to show


def to_device(batch, device: torch.device, non_blocking: bool = False):
    """Every tensor of a batch (an (x, y) pair, a dict of input_ids, any nesting) on `device`, the rest as it is.
    non_blocking=True returns before the copy is done, so the host can go on queueing work; it only overlaps
    anything when the host tensor is in pinned memory."""
    return tree_map(lambda t: t.to(device, non_blocking=non_blocking) if isinstance(t, torch.Tensor) else t, batch)


def init_worker(worker_id: int) -> None:
    """Runs first in each worker process."""
    # GNU OpenMP cannot run a parallel region in a child forked after the parent ran one: the child waits
    # for threads the fork did not copy.  On one thread there is no parallel region (torch's worker loop
    # sets this too; it is said again here, where it matters)
    torch.set_num_threads(1)
    # Ctrl-C goes to the whole process group, as a closed terminal's SIGHUP does: the run (the main process)
    # stops and then ends its workers; a worker that died of it first would turn a clean stop into "worker
    # exited unexpectedly".  SIGTERM stays: it is how the loader ends a worker that does not stop when asked
    for signum in (signal.SIGINT, getattr(signal, "SIGHUP", None)):
        if signum is not None:
            signal.signal(signum, signal.SIG_IGN)


class LoaderBatches:
    """Endless batches of a DataLoader (whose sampler never ends), copied to `device`.

    `close()` ends the loader's worker processes at once.  Dropping the last reference would end them
    too, but not soon enough: a traceback being handled (or kept by a notebook) holds the loader's frames,
    and with them its workers, alive."""

    def __init__(self, loader: DataLoader, device: torch.device, non_blocking: bool = False):
        self._iterator = iter(loader)  # with workers, this starts them
        self.device, self.non_blocking = device, non_blocking

    def __iter__(self) -> LoaderBatches:
        return self

    def __next__(self):
        try:
            batch = next(self._iterator)
        except StopIteration:
            raise
        except Exception as exc:
            dead = self._dead_worker()
            if dead is None:
                raise
            raise DataWorkerDied(dead) from exc
        return to_device(batch, self.device, self.non_blocking)

    def _dead_worker(self) -> str | None:
        """Which worker died, in words, if one did: a worker killed while it fed the queue makes the fetch fail
        with whatever the queue saw (a reset connection, an EOF), maybe a moment before its exit shows."""
        workers = list(getattr(self._iterator, "_workers", []))
        deadline = time.monotonic() + DEAD_WORKER_WAIT_S
        while workers:
            dead = [w for w in workers if not w.is_alive()]
            if dead:
                return (f"a data-loader worker process died ({'; '.join(_death(w) for w in dead)}: killed, or it "
                        f"crashed outside Python); the run cannot get its batches")
            if time.monotonic() > deadline:
                return None
            time.sleep(0.02)
        return None

    def worker_pids(self) -> list[int]:
        """The process ids of the loader's workers (none without workers, or once closed)."""
        return [w.pid for w in getattr(self._iterator, "_workers", []) if w.is_alive()]

    def close(self) -> None:
        shutdown = getattr(self._iterator, "_shutdown_workers", None)  # only a multi-process iterator has one
        if shutdown is not None:
            shutdown()  # signals the workers, joins them, and terminates any that do not stop


def _death(worker) -> str:
    code = worker.exitcode
    if code is not None and code < 0:
        try:
            how = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"killed by signal {-code}"
    else:
        how = f"exited with code {code}"
    return f"pid {worker.pid}, {how}"


class CountedBatches:
    """The run's batches, counted as the pipeline delivers them (before any echo), and closed with the run."""

    def __init__(self, source: Iterator):
        self.source = source
        self.count = 0

    def __iter__(self) -> CountedBatches:
        return self

    def __next__(self):
        batch = next(self.source)
        self.count += 1
        return batch

    def close(self) -> None:
        close = getattr(self.source, "close", None)  # LoaderBatches and generators have one
        if close is not None:
            close()


class MappedBatches:
    """Batches of a pipeline, each changed by `fn` (into the form a model family's loss takes), closed with it."""

    def __init__(self, source, fn):
        self.source, self.fn = source, fn

    def __iter__(self) -> MappedBatches:
        return self

    def __next__(self):
        return self.fn(next(self.source))

    def close(self) -> None:
        self.source.close()
