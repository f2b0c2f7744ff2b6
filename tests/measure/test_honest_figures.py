"""Figures that are right where they used to mislead: peak memory that counts what is resident in every run,
a dead data-loader worker named whatever torch raised, measured steps shown beside a failure, and a
generation of one token (no decode step) said as such."""

from __future__ import annotations

import os
import signal

import torch

from scalekit.inference import GenerateConfig, generate
from tests.helpers import one_thread

QUIET = dict(quality=False, warmup_tokens=0, device="cpu")


# -- peak memory: resident buffers counted the same way in every run ---------------------------------------
class TableModel(torch.nn.Module):
    """A model holding a 1 MiB non-persistent buffer, which its forward reads (a view: no new memory) or not;
    the two variants hold and allocate exactly the same tensors."""

    def __init__(self, reads_buffer: bool):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 16)
        self.register_buffer("table", torch.zeros(512, 512, dtype=torch.float32), persistent=False)
        self.reads_buffer = reads_buffer

    def forward(self, idx):
        if self.reads_buffer:
            _ = self.table[: idx.shape[1]]  # a view of the buffer, as the GPT's causal mask is sliced
        return self.head(self.emb(idx))


def test_two_generations_holding_the_same_tensors_report_the_same_peak():
    with one_thread():
        peaks = [generate(GenerateConfig(model=TableModel(reads), prompts=[[1, 2, 3]], max_new_tokens=4, **QUIET))
                 .peak_mem_bytes for reads in (False, True)]
    assert peaks[0] == peaks[1], peaks
    assert peaks[0] >= 512 * 512 * 4  # the buffer is resident: counted in both


def test_the_gpts_causal_masks_count_with_and_without_a_kv_cache():
    with one_thread():
        runs = {kind: generate(GenerateConfig(max_new_tokens=8, toggles={"kv_cache": kind} if kind else {}, **QUIET))
                for kind in (None, "dynamic")}
    masks = sum(b.numel() * b.element_size() for name, b in _gpt().named_buffers() if "mask" in name)
    assert masks >= 4 * 2**20  # 4 layers × a 1024 × 1024 bool mask
    for kind, r in runs.items():
        assert r.peak_mem_bytes >= r.weight_bytes + masks, (kind, r.peak_mem_bytes, r.weight_bytes, masks)


def _gpt():
    from scalekit.models.pretrained import load_pretrained

    return load_pretrained("shakespeare-char")


# -- a dead data-loader worker, whatever torch raised -----------------------------------------------------------
class DeadWorker:
    """A process as torch's DataLoader iterator keeps it: is_alive(), exitcode, pid."""

    def __init__(self, pid: int, exitcode: int | None):
        self.pid, self.exitcode = pid, exitcode

    def is_alive(self) -> bool:
        return self.exitcode is None


class FailingIterator:
    """A multi-process DataLoader iterator whose worker died: next() raises what torch raised in that case."""

    def __init__(self, raised: BaseException, workers):
        self.raised, self._workers = raised, workers

    def __next__(self):
        raise self.raised

    def _shutdown_workers(self):
        pass


def loader_batches(raised: BaseException, workers):
    from scalekit.data.pipeline import LoaderBatches

    batches = LoaderBatches.__new__(LoaderBatches)
    batches._iterator, batches.device, batches.non_blocking = FailingIterator(raised, workers), "cpu", False
    return batches


def test_a_killed_worker_is_named_in_plain_words_whatever_torch_raised():
    from scalekit.errors import plain_error

    for raised in (ConnectionResetError(104, "Connection reset by peer"), EOFError(), BrokenPipeError(32, "x"),
                   RuntimeError("DataLoader worker (pid(s) 4242) exited unexpectedly")):
        batches = loader_batches(raised, [DeadWorker(4242, -signal.SIGKILL), DeadWorker(4243, None)])
        try:
            next(batches)
        except Exception as exc:  # noqa: BLE001 - what the run's shell would catch
            words = plain_error(exc)
        assert words.startswith("a data-loader worker process died"), words
        assert "4242" in words and "SIGKILL" in words, words
        assert "Connection reset" not in words.split(":")[0]


def test_an_error_with_every_worker_alive_is_left_as_it_is():
    raised = ValueError("a transform failed")
    batches = loader_batches(raised, [DeadWorker(1, None)])
    try:
        next(batches)
    except ValueError as exc:
        assert exc is raised


def test_a_failed_run_shows_the_steps_it_measured_beside_the_failure():
    from scalekit.measure.summary import summarise_steps
    from scalekit.training.report import results_table
    from scalekit.training.results import RunResult, StepRecord

    result = RunResult(label="workers", config={}, status="failed", tokens_per_step=100,
                       error="a data-loader worker process died (pid 7, killed by SIGKILL)")
    result.steps = [StepRecord(step=i, warmup=i < 1, step_ms=10.0 + i % 3, tokens_per_s=1e4, loss=None, mem_bytes=None,
                               tokens=100)
                    for i in range(214)]
    summarise_steps(result, None, "no peak")
    table = results_table([result])
    row = table.splitlines()[2]
    assert row.split()[1] == "11.00", table  # the median step time of what was measured
    assert "FAILED after 213 measured steps" in row and "data-loader worker process died" in row, table


# -- one new token: no decode step --------------------------------------------------------------------------------
def test_a_single_new_token_says_there_is_no_decode_step():
    from scalekit.inference.report import generation_table

    with one_thread():
        r = generate(GenerateConfig(max_new_tokens=1, **QUIET))
    assert r.status == "ok" and r.decode_ms is None and r.decode_tokens_per_s is None
    table = generation_table([r])
    assert "nan" not in table
    assert "no decode step" in table and "TTFT" in table
    assert table.splitlines()[-1].startswith("device:")  # the footer is kept
    import json

    json.loads(json.dumps(r.to_dict()), parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))  # no NaN


def test_workers_named_in_words_end_to_end():
    """A real worker killed with SIGKILL mid-run: the failure names it and the table shows the measured steps."""
    import psutil

    from scalekit import run
    from scalekit.training.report import results_table
    from tests.helpers import tiny

    seen = {}

    def kill_one(record):
        if record.step == 3 and not seen:
            seen["pid"] = min(p.pid for p in psutil.Process().children())  # the loader's workers
            os.kill(seen["pid"], signal.SIGKILL)

    result = run(tiny(data="shakespeare-raw", transform_rounds=1, steps=200, log_every=1, warmup_steps=1,
                      toggles={"dataloader_num_workers": 2}), on_step=kill_one, catch_errors=True)
    assert result.status == "failed" and result.error.startswith("a data-loader worker process died"), result.error
    assert str(seen["pid"]) in result.error
    row = results_table([result]).splitlines()[2]
    assert "measured steps" in row and row.split()[1] != "—", row
