"""One launch's folder and the files in it, named once: the ranks write them, the agent and the report read them."""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunFiles:
    root: Path  # a fresh folder in the temp folder, removed when the launch ends unless kept

    def out(self, rank: int) -> Path:
        return self.root / f"rank{rank}.out"  # the rank's stdout, streamed with its prefix

    def err(self, rank: int) -> Path:
        return self.root / f"rank{rank}.err"

    def failure(self, rank: int) -> Path:
        return self.root / f"failure-rank{rank}.json"  # a forked rank that raised: what, its traceback, when

    def done(self, rank: int) -> Path:
        return self.root / f"done-rank{rank}"  # a forked rank whose function returned: it waits for the others

    def stacks(self, rank: int) -> Path:
        return self.root / f"stack-rank{rank}.txt"  # where a forked rank was, asked at a timeout

    def torch_error(self, rank: int) -> Path:
        return self.root / f"rank{rank}.error.json"  # TORCHELASTIC_ERROR_FILE: a script's @record writes it

    def touch_logs(self, nprocs: int) -> None:
        for rank in range(nprocs):
            self.out(rank).touch()
            self.err(rank).touch()


@contextlib.contextmanager
def run_folder(keep_logs: bool, signals) -> Iterator[RunFiles]:
    """The folder of one launch's rank output and records: removed however the launch ends, unless kept."""
    files = RunFiles(Path(tempfile.mkdtemp(prefix="scalekit-launch-")))
    try:
        yield files
    finally:
        with signals.held():
            if keep_logs:
                print(f"scalekit.launch: the ranks' logs are kept in {files.root}", file=sys.stderr, flush=True)
            else:
                shutil.rmtree(files.root, ignore_errors=True)
