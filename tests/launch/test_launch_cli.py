"""`scalekit launch` on one node, and two "nodes" on one machine training together over torchrun's rendezvous."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

import scalekit
from scalekit.cli.main import main
from scalekit.launch import torchrun_command
from tests.forking import no_process_left_behind  # noqa: F401 - deadline and cleanup
from tests.helpers import tiny

SCRIPT = textwrap.dedent("""
    import os, sys
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([dist.get_rank() + 1.0]); dist.all_reduce(t)
    print("rank", dist.get_rank(), "of", dist.get_world_size(), "sum", t.item(), "args", sys.argv[1:])
    dist.destroy_process_group()
""")


def test_launch_a_script_on_this_machine(tmp_path, capsys):
    script = tmp_path / "allreduce.py"
    script.write_text(SCRIPT)
    assert main(["launch", "--nproc-per-node", "2", str(script), "--lr", "3"]) == 0
    out = capsys.readouterr().out
    for r in (0, 1):
        assert f"[rank{r}]: rank {r} of 2 sum 3.0 args ['--lr', '3']" in out, out


def test_launch_reports_a_failing_script_with_exit_code_1(tmp_path, capsys):
    script = tmp_path / "fails.py"
    script.write_text("import os\nif os.environ['RANK'] == '1':\n    raise SystemExit('rank one gave up')\n")
    assert main(["launch", "--nproc-per-node", "2", str(script)]) == 1
    captured = capsys.readouterr()
    assert "[rank1]: rank one gave up" in captured.err and "rank 1 ended with exit code 1" in captured.err


def test_print_torchrun_prints_the_command_for_each_node(capsys):
    argv = ["launch", "--print-torchrun", "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "10.1.2.3:29400",
            "--nproc-per-node", "8", "train.py", "--steps", "9"]
    assert main(argv) == 0
    assert capsys.readouterr().out.strip() == ("torchrun --nproc-per-node=8 --nnodes=2 --node-rank=1 "
                                               "--rdzv-backend=static --rdzv-endpoint=10.1.2.3:29400 train.py "
                                               "--steps 9")


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


def test_two_nodes_on_one_machine_train_together(tmp_path):
    cfg = tiny(toggles=["ddp"], batch_size=8, steps=3, warmup_steps=1, log_every=1)
    out = tmp_path / "node0.json"
    endpoint = f"127.0.0.1:{free_port()}"
    nodes = []
    for node_rank in (0, 1):
        # the exact command scalekit prints for this configuration, run through `scalekit launch`
        cmd = torchrun_command(cfg, nproc_per_node=1, nnodes=2, node_rank=node_rank, rdzv_endpoint=endpoint,
                               args=["--json", str(out)])
        assert cmd[0] == "torchrun" and "-m" in cmd
        argv = [sys.executable, "-m", "scalekit.cli.main", "launch", "--nnodes", "2", "--node-rank", str(node_rank),
                "--rdzv-endpoint", endpoint, "--nproc-per-node", "1", *cmd[cmd.index("-m"):]]
        # two "machines" share these cores: one thread each, or OpenMP's spinning threads fight
        env = dict(os.environ, OMP_NUM_THREADS="1")
        nodes.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    try:
        logs = [p.communicate(timeout=80) for p in nodes]
    finally:
        for p in nodes:
            p.kill()
    assert [p.returncode for p in nodes] == [0, 0], [err[-3000:] for _, err in logs]
    assert "ddp" in logs[0][0]  # node 0 holds global rank 0: it prints the table
    result = json.loads(out.read_text())
    assert result["world_size"] == 2 and len(result["per_rank"]) == 2
    # two nodes of one rank each, 4 sequences each, trained exactly like one process with all 8
    single = scalekit.run(tiny(batch_size=8, steps=3, warmup_steps=1, log_every=1))
    assert [loss for _, loss in result["losses"]] == pytest.approx([loss for _, loss in single.losses], abs=1e-5)
