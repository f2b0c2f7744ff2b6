"""A `compile` row says what torch.compile captured: a model dynamo cannot trace runs eagerly, and the row says so."""

from __future__ import annotations

import torch
from torch import nn

from scalekit import RunConfig, generate, run
from scalekit.measure import compiled
from scalekit.measure.compiled import Captured, CompileWatch, graphs_made, short_reason

VOCAB, SEQ = 40, 12


class GRULM(nn.Module):
    """A user's language model around an nn.GRU, which dynamo does not trace (it runs the whole forward eagerly)."""

    def __init__(self):
        super().__init__()
        self.emb, self.rnn, self.head = nn.Embedding(VOCAB, 16), nn.GRU(16, 16, batch_first=True), nn.Linear(16, VOCAB)

    def forward(self, ids):
        return self.head(self.rnn(self.emb(ids))[0])


class Broken(nn.Module):
    """Two linear layers with a graph break between them."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        x = self.a(x).relu()
        torch._dynamo.graph_break()
        return self.b(x)


def next_token_loss(model, batch):
    logits = model(batch[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))


def random_batches(batch_size, device):
    return torch.randint(0, VOCAB, (batch_size, SEQ + 1), device=device)


def test_dynamos_counters_are_where_the_watch_reads_them():
    """The names the watch reads (torch._dynamo.utils.counters): this fails first if a torch release moves them."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    graphs = graphs_made()
    torch.compile(Broken(), backend="eager")(torch.randn(2, 8))
    assert counters[compiled.GRAPHS[0]][compiled.GRAPHS[1]] == graphs + 2  # one graph each side of the break
    assert any("graph_break" in reason for reason in counters[compiled.BREAKS]), dict(counters[compiled.BREAKS])
    torch.compile(GRULM(), backend="eager")(torch.randint(0, VOCAB, (2, SEQ)))
    assert any("RNN" in reason for reason in counters[compiled.GAVE_UP]), dict(counters[compiled.GAVE_UP])


def test_the_watch_counts_graphs_breaks_and_recompiles_from_its_start():
    torch._dynamo.reset()
    torch.compile(Broken(), backend="eager")(torch.randn(2, 8))  # before the watch: not counted
    torch._dynamo.reset()  # (which leaves the counters as they are)
    watch = CompileWatch()
    model = torch.compile(Broken(), backend="eager")
    with watch.step(measured=False):
        model(torch.randn(2, 8))
    with watch.step(measured=True):
        model(torch.randn(2, 8))  # the same shapes: nothing new
    assert watch.graphs_in_measured_steps == 0
    with watch.step(measured=True):
        model(torch.randn(3, 8, 8))  # a new rank: dynamo recompiles both graphs
    captured = watch.captured()
    assert watch.graphs_in_measured_steps == 2
    assert (captured.graphs, captured.graph_breaks, captured.frames_given_up) == (4, 2, 0)
    assert "graph_break" in captured.reasons[0]
    assert captured.note().startswith("compile made 4 graphs, with 2 graph breaks (dynamo: ")


def test_the_notes_say_what_was_not_captured_and_nothing_when_all_was():
    assert Captured(1, 0, 0, ()).note() == ""
    assert Captured(0, 0, 1, ("Attempted to wrap RNN, GRU, or LSTM",)).note() == (
        "compile captured no graph: the model ran eagerly, so this row measures eager code (dynamo: Attempted to "
        "wrap RNN, GRU, or LSTM)")
    assert Captured(3, 1, 1, ("a", "b")).note() == (
        "compile made 3 graphs, with 1 graph break and 1 function dynamo could not trace, run eagerly (dynamo: a)")
    message = ("Attempted to wrap RNN, GRU, or LSTM\n  Explanation: Dynamo does not support RNN, GRU, or LSTM.\n"
               "  Hint: Set torch._dynamo.config.allow_rnn=True\n\n  Developer debug context: GRU(32, 32)\n")
    assert short_reason(message) == "Attempted to wrap RNN, GRU, or LSTM: Dynamo does not support RNN, GRU, or LSTM."
    assert short_reason("one line") == "one line" and short_reason("\n \n") == ""


def test_a_compile_row_of_a_model_dynamo_cannot_trace_says_it_measured_eager_code():
    cfg = dict(model=GRULM, batch_fn=random_batches, loss_fn=next_token_loss, tokens_per_sample=SEQ, batch_size=4,
               steps=3, warmup_steps=1, measure_memory=False)
    eager = run(RunConfig(**cfg))
    compiled = run(RunConfig(**cfg, toggles=["compile"]))
    assert compiled.status == "ok", compiled.error
    assert compiled.graphs_compiled == 0 and compiled.graph_breaks == 0
    note = next(n for n in compiled.notes if n.startswith("compile captured no graph"))
    assert "RNN, GRU, or LSTM" in note
    assert eager.graphs_compiled is None and not any("compile" in n for n in eager.notes)
    assert compiled.final_loss == eager.final_loss  # the same eager code ran


def test_a_compiled_generation_of_a_model_dynamo_cannot_trace_says_so():
    generated = generate(model=GRULM(), prompts=[[1, 2, 3]], max_new_tokens=6, toggles={"compile": True},
                         warmup_tokens=2)
    assert generated.status == "ok", generated.error
    assert generated.graphs_compiled == 0 and generated.compile_note.startswith("compile captured no graph")
    assert generated.compile_note in generated.notes and "RNN, GRU, or LSTM" in generated.compile_note


def test_a_run_stopped_in_its_first_step_says_nothing_of_what_compile_captured():
    """Ctrl-C while the first step compiles: no graph was made, but nothing ran eagerly either."""

    def interrupted(model, batch):
        if isinstance(model, torch._dynamo.eval_frame.OptimizedModule):  # a step, not the FLOP count at build
            raise KeyboardInterrupt
        return next_token_loss(model, batch)

    stopped = run(RunConfig(model=GRULM, batch_fn=random_batches, loss_fn=interrupted, tokens_per_sample=SEQ,
                            batch_size=4, steps=3, warmup_steps=1, measure_memory=False, toggles=["compile"]))
    assert stopped.status == "stopped" and not stopped.steps
    assert stopped.graphs_compiled == 0 and stopped.compile_note == ""
    assert not any("compile" in note for note in stopped.notes), stopped.notes
