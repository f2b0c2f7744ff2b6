"""Every mode of every toggle that needs several processes × every kind of model (tests/families.py), on 2 gloo
ranks: it trains a step, or it is refused in one line that names the model's class and the reason.  No crash, no
traceback at a user, no rank left waiting.

One launch for every kind (a launch's ranks import transformers, peft and DeepSpeed once): both ranks join one
process group and run every cell in turn (scalekit.run uses a group that is alive, and leaves it alive), a barrier
between cells.  A refusal is a ConfigError (ToggleUnavailable
is one), raised alike on both ranks before any collective; anything else raised is the cell's failure, reported with
its type.  A mesh the 2 ranks cannot form (tensor_parallel=8) is refused by RunConfig.check_ranks, as `scalekit bench`
and `launch_run` refuse it before starting any rank."""

from __future__ import annotations

import pytest

import scalekit
from scalekit.launch import launch
from scalekit.toggles import ORDER
from tests.families import MODEL_KINDS, WITH, modes, one_line, one_step
from tests.forking import no_process_left_behind  # noqa: F401 - the same deadline and cleanup here

pytestmark = pytest.mark.filterwarnings("ignore")
RANKS = 2
# the kinds of tests/families.py but GPT-NeoX (its parallel layouts are tests/distributed/test_distributed_*_families.py's) and
# the ConvNet (a user's own module is the plain LM's case already): every cell is a launch-free run, 1-3 s of CPU a rank
KINDS = [kind for kind in MODEL_KINDS if kind not in ("HF GPT-NeoX", "ConvNet")]
CELLS = [(t.name, value) for t in ORDER if "train" in t.loops and t.needs_process_group for value in modes(t.name)]


def cell_outcome(kind: str, name: str, value) -> tuple[str, str]:
    """("ok", "") when the step ran, ("refused", message) for a ConfigError, ("crashed", type: message) else;
    ("no mesh", message) when the ranks cannot form the toggle's mesh, whatever the model (checked before a run)."""
    from scalekit import ConfigError
    from scalekit.training.engine import run

    fields, _, _ = MODEL_KINDS[kind]
    try:
        cfg = one_step(fields(), {name: value, **WITH.get(name, {})})
    except ConfigError as exc:
        return "refused", str(exc)
    try:
        cfg.check_ranks(RANKS)
    except ConfigError as exc:
        return "no mesh", str(exc)
    try:
        result = run(cfg, hw=scalekit.detect("cpu"))
    except ConfigError as exc:
        return "refused", str(exc)
    except Exception as exc:  # noqa: BLE001 - every other failure is this cell's, reported
        return "crashed", f"{type(exc).__name__}: {exc}"[:2000]
    return ("ok", "") if result.status == "ok" else (result.status, result.error or "")


def every_cell() -> dict:
    """{kind: {"toggle=mode": (status, message)}} of this rank."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # 2 ranks on a machine that may have 2 cores
    dist.init_process_group("gloo")
    try:
        out: dict = {}
        for kind in KINDS:
            for name, value in CELLS:
                out.setdefault(kind, {})[f"{name}={value}"] = cell_outcome(kind, name, value)
                dist.barrier()
        return out
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def outcomes():
    return launch(every_cell, nprocs=RANKS, timeout_s=900)


@pytest.mark.parametrize("kind", KINDS)
def test_every_multi_rank_mode_trains_or_refuses_in_one_line(kind, outcomes):
    family = MODEL_KINDS[kind][2]
    ranks = [rank[kind] for rank in outcomes]
    assert ranks[0].keys() == ranks[1].keys()
    problems = []
    for cell, (status, message) in ranks[0].items():
        other = ranks[1][cell][0]
        if other != status:
            problems.append(f"{cell}: rank 0 {status}, rank 1 {other}")
        elif status == "refused" and not (one_line(message) and family in message):
            problems.append(f"{cell}: the refusal is not one line naming {family}: {message}")
        elif status == "no mesh" and not (one_line(message) and f"{RANKS} ranks" in message):
            problems.append(f"{cell}: the refusal is not one line naming the {RANKS} ranks: {message}")
        elif status not in ("ok", "refused", "no mesh"):
            problems.append(f"{cell}: {status}: {message}")
    assert not problems, "\n".join(problems)
    assert any(status == "ok" for status, _ in ranks[0].values()), ranks[0]  # ddp at least trains every kind
