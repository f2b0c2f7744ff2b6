"""Launching from a real Jupyter kernel (through nbclient): notebook-defined functions, a failing rank,
the %%torchrun magic, and the guards after `import bitsandbytes` or CUDA initialisation."""

from __future__ import annotations

import os

import nbformat
import psutil
import pytest
from nbclient import NotebookClient

from tests.forking import no_process_left_behind  # noqa: F401 - deadline and cleanup


def output_text(cell) -> str:
    parts = []
    for o in cell.outputs:
        if o.output_type == "stream":
            parts.append(o.text)
        elif o.output_type == "error":
            parts.append(f"{o.ename}: {o.evalue}")
    return "".join(parts)


CELLS = {
    "setup": "import time, psutil, torch, torch.distributed as dist\nimport scalekit\n"
             "from scalekit.launch import LaunchError, ForkUnsafeError",
    "define": "def train(x):\n"
              "    dist.init_process_group('gloo')\n"
              "    t = torch.tensor([dist.get_rank() + 1.0]); dist.all_reduce(t)\n"
              "    print('rank', dist.get_rank(), 'sum', t.item())\n"
              "    return dist.get_rank() * x",
    "launch": "assert scalekit.launch(train, 5, nprocs=2) == [0, 5]",
    "fail": "def bad():\n"
            "    dist.init_process_group('gloo')\n"
            "    if dist.get_rank() == 1:\n"
            "        raise ValueError('rank one broke')\n"
            "    time.sleep(60)\n"
            "t0 = time.monotonic()\n"
            "try:\n"
            "    scalekit.launch(bad, nprocs=2)\n"
            "except LaunchError as e:\n"
            "    error = e\n"
            "elapsed_s = time.monotonic() - t0\n"
            "assert error.rank == 1 and elapsed_s < 10, (error.rank, elapsed_s)\n"
            "assert psutil.Process().children(recursive=True) == []\n"
            "print('failed rank', error.rank, 'after', round(elapsed_s, 1), 's')",
    "again": "assert scalekit.launch(train, 2, nprocs=2) == [0, 2]",
    "magic_load": "%load_ext scalekit",
    "magic": "%%torchrun --nproc-per-node 2\n"
             "import torch, torch.distributed as dist\n"
             "dist.init_process_group('gloo')\n"
             "t = torch.tensor([dist.get_rank() + 1.0]); dist.all_reduce(t)\n"
             "print('magic sum', t.item(), 'world', dist.get_world_size())\n"
             "dist.destroy_process_group()",
    "cuda_guard": "torch.cuda._initialized = True  # what a CUDA context looks like to torch, simulated on CPU\n"
                  "try:\n"
                  "    scalekit.launch(train, 1, nprocs=2)\n"
                  "except ForkUnsafeError as e:\n"
                  "    print(e)\n"
                  "finally:\n"
                  "    torch.cuda._initialized = False",
    "bnb_guard": "import bitsandbytes\n"
                 "try:\n"
                 "    scalekit.launch(train, 1, nprocs=2)\n"
                 "except ForkUnsafeError as e:\n"
                 "    print(e)",
}


@pytest.fixture(scope="module")
def executed():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in CELLS.values()])
    NotebookClient(nb, timeout=90, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": os.getcwd()}}).execute()
    return dict(zip(CELLS, nb.cells, strict=True))


def test_a_function_defined_in_the_notebook_runs_in_ranks_with_prefixed_output(executed):
    text = output_text(executed["launch"])
    assert "[rank0]: rank 0 sum 3.0" in text and "[rank1]: rank 1 sum 3.0" in text, text
    assert "Error" not in text


def test_a_failing_rank_shows_its_traceback_in_the_cell_and_the_kernel_launches_again(executed):
    text = output_text(executed["fail"])
    assert "failed rank 1 after" in text, text
    assert "[rank1]: ValueError: rank one broke" in text  # the rank's own traceback, streamed
    assert "[rank1]:     raise ValueError('rank one broke')" in text
    again = output_text(executed["again"])
    assert "[rank0]: rank 0 sum 3.0" in again and "Error" not in again, again


def test_the_torchrun_magic_runs_the_cell_in_ranks(executed):
    text = output_text(executed["magic"])
    assert "[rank0]: magic sum 3.0 world 2" in text and "[rank1]: magic sum 3.0 world 2" in text, text


def test_guards_answer_with_what_to_do(executed):
    cuda = output_text(executed["cuda_guard"])
    assert "CUDA is already initialised" in cuda and "restart the kernel" in cuda and "%%torchrun" in cuda, cuda
    bnb = output_text(executed["bnb_guard"])
    assert "bitsandbytes is already imported" in bnb and "inside the launched function" in bnb, bnb
    assert "[rank" not in cuda + bnb  # refused before any rank started


def test_the_kernel_left_no_process_behind(executed):
    assert psutil.Process().children(recursive=True) == []
