"""What torch.compile captured during a run: graphs made, graph breaks taken, and why dynamo broke or gave up.

A model dynamo cannot trace still runs (eagerly), so a row labelled `compile` may measure no compiled code at
all: an nn.GRU or nn.LSTM inside the model, for one, makes dynamo give up the whole forward.  The watch says so
beside the row's figures instead of letting "within noise" read as "compile does not help this model".

The figures come from dynamo's counters (`torch._dynamo.utils.counters`: the ones torch's own tests check;
tests/toggles/test_compile_capture.py fails if torch renames them), read as differences over the run, since earlier
runs in the process add to them and `torch._dynamo.reset()` leaves them be.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

GRAPHS = ("stats", "unique_graphs")  # one per graph dynamo hands to the compiler
BREAKS = "graph_break"  # reason -> times dynamo split a frame there, the code between the graphs run eagerly
GAVE_UP = "unimplemented"  # reason -> times dynamo stopped tracing a frame and ran all of it eagerly


def _counters():
    from torch._dynamo.utils import counters

    return counters


def graphs_made() -> int:
    """Graphs torch.compile has made in this process so far."""
    return int(_counters()[GRAPHS[0]][GRAPHS[1]])


@dataclass(frozen=True)
class Captured:
    """What one run compiled: `graphs` made, `graph_breaks` taken, functions dynamo gave up on and ran eagerly
    (`frames_given_up`), and dynamo's reasons, the most frequent first."""

    graphs: int
    graph_breaks: int
    frames_given_up: int
    reasons: tuple[str, ...]

    def note(self) -> str:
        """A sentence for the run's notes when compile did not capture the model whole ("" when it did)."""
        why = f" (dynamo: {self.reasons[0]})" if self.reasons else ""
        if self.graphs == 0:
            return f"compile captured no graph: the model ran eagerly, so this row measures eager code{why}"
        gaps = [_count(self.graph_breaks, "graph break"),
                _count(self.frames_given_up, "function dynamo could not trace, run eagerly",
                       "functions dynamo could not trace, run eagerly")]
        gaps = [gap for gap in gaps if gap]
        if not gaps:
            return ""
        return f"compile made {_count(self.graphs, 'graph')}, with {' and '.join(gaps)}{why}"


COMPILE_NO_OP = "compile no-op"  # the flag a row carries when compile was on and captured no graph


def compile_flags(graphs_compiled: int | None) -> list[str]:
    """A result's flags from what compile captured: COMPILE_NO_OP when it was on and made no graph (the row measured
    eager code under compile's label), none otherwise (compile off: graphs_compiled is None)."""
    return [COMPILE_NO_OP] if graphs_compiled == 0 else []


def _count(n: int, one: str, many: str | None = None) -> str:
    return "" if n == 0 else f"{n} {one if n == 1 else many or one + 's'}"


def short_reason(message: str) -> str:
    """Dynamo's reason in one line: its title, and its explanation when it gives one."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    explanation = next((line.split(":", 1)[1].strip() for line in lines[1:] if line.startswith("Explanation:")), "")
    return f"{lines[0]}: {explanation}" if explanation and explanation != lines[0] else lines[0]


class CompileWatch:
    """Counts what torch.compile makes from here on, and the graphs made inside measured steps: recompiles, whose
    compile time lands in a step's time."""

    def __init__(self) -> None:
        counters = _counters()
        self._graphs0 = graphs_made()
        self._breaks0, self._gave_up0 = Counter(counters[BREAKS]), Counter(counters[GAVE_UP])
        self.graphs_in_measured_steps = 0

    @contextlib.contextmanager
    def step(self, measured: bool) -> Iterator[None]:
        before = graphs_made()
        yield
        if measured:
            self.graphs_in_measured_steps += graphs_made() - before

    def captured(self) -> Captured:
        counters = _counters()
        breaks = Counter(counters[BREAKS]) - self._breaks0
        gave_up = Counter(counters[GAVE_UP]) - self._gave_up0
        reasons = [short_reason(r) for r, _ in (gave_up + breaks).most_common()]
        return Captured(graphs=graphs_made() - self._graphs0, graph_breaks=sum(breaks.values()),
                        frames_given_up=sum(gave_up.values()), reasons=tuple(dict.fromkeys(r for r in reasons if r)))
