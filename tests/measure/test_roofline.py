"""The roofline's counts: a matmul's, a linear's and a layer norm's FLOPs and bytes as the formulas give them,
torch's own FLOP count of a whole step, the ridge point, and the batch at which a matmul turns compute-bound."""

import torch
from torch.utils.flop_counter import FlopCounterMode

from scalekit.measure import roofline as rl
from scalekit.models import GPT, PRESETS


def counted(fn):
    counter = rl.OpCounter()
    with counter:
        fn()
    return counter.costs()


def test_a_matmul_counts_as_the_formula():
    a, b = torch.randn(6, 5), torch.randn(5, 7)
    (op,) = counted(lambda: a @ b)
    assert op.op == "mm" and op.calls == 1
    assert op.flops == rl.matmul_flops(6, 5, 7) == 2 * 6 * 5 * 7
    assert op.nbytes == rl.matmul_bytes(6, 5, 7, 4) == (6 * 5 + 5 * 7 + 6 * 7) * 4
    assert op.intensity == rl.matmul_intensity(6, 5, 7, 4)


def test_a_linear_and_a_layer_norm_count_as_the_formulas():
    for dtype, size in ((torch.float32, 4), (torch.bfloat16, 2)):
        linear = torch.nn.Linear(8, 3, dtype=dtype)
        x = torch.randn(10, 8, dtype=dtype)
        (op,) = counted(lambda linear=linear, x=x: linear(x))
        assert op.op == "addmm" and op.flops == rl.linear_flops(10, 8, 3)
        assert op.nbytes == rl.linear_bytes(10, 8, 3, size) == (10 * 8 + 8 * 3 + 10 * 3 + 3) * size
        without = torch.nn.Linear(8, 3, bias=False, dtype=dtype)
        (op,) = counted(lambda without=without, x=x: without(x))
        assert op.op == "mm" and op.flops == rl.linear_flops(10, 8, 3)
        assert op.nbytes == rl.linear_bytes(10, 8, 3, size, bias=False)
    norm, x = torch.nn.LayerNorm(16), torch.randn(12, 16)
    (op,) = counted(lambda: norm(x))
    assert op.op == "native_layer_norm"
    assert op.flops == rl.layer_norm_flops(12, 16) == 8 * 12 * 16
    assert op.nbytes == rl.layer_norm_bytes(12, 16, 4) == (2 * 12 * 16 + 2 * 16) * 4 + 2 * 12 * 4


def test_views_move_nothing_a_broadcast_input_is_read_once_and_a_list_counts_whole():
    x = torch.randn(4, 3)
    assert counted(lambda: x.t().unsqueeze(0)[0].view(3, 4)) == []
    row = torch.randn(3)
    (op,) = counted(lambda: x + row.expand(4, 3))
    assert op.nbytes == (12 + 3 + 12) * 4 and op.flops == 12
    params = [torch.zeros(5), torch.zeros(2, 3)]
    (op,) = counted(lambda: torch._foreach_add_(params, 1.0))  # an optimizer's update, every tensor at once
    assert op.op == "_foreach_add_" and op.flops == 11 and op.nbytes == 2 * 11 * 4


def test_the_matmuls_of_a_step_are_what_torchs_own_counter_counts():
    torch.manual_seed(0)
    model = GPT(PRESETS["tiny"].gpt_config())
    x = torch.randint(0, 65, (2, 16))

    def step():
        _, loss = model(x, x)
        loss.backward()

    with FlopCounterMode(display=False) as reference:
        step()
    registry = {"mm", "addmm", "bmm", "baddbmm"}
    ops = rl.count_step(step, steps=2, warmup=0, threads=1).ops
    assert sum(o.flops for o in ops if o.op in registry) == reference.get_total_flops()
    assert {"native_layer_norm", "_log_softmax", "embedding"} <= {o.op for o in ops}
    assert all(o.nbytes > 0 and o.time_s >= 0 for o in ops)


def test_the_ridge_point_is_peak_over_bandwidth():
    roof = rl.Roof("part", peak_flops=1000.0, bandwidth=50.0)
    assert roof.ridge == 20.0
    assert roof.attainable(5.0) == 250.0 and roof.attainable(20.0) == 1000.0 == roof.attainable(400.0)
    assert roof.time_s(1000.0, 10.0) == 1.0 and roof.time_s(10.0, 100.0) == 2.0
    h100 = rl.Roof("H100", 989.4e12, 3.35e12)
    assert abs(h100.ridge - 295.3) < 0.1
    low = rl.OpCost("mul", "", "", 1, 100.0, 100.0, 1.0)
    high = rl.OpCost("mm", "", "", 1, 10_000.0, 100.0, 1.0)
    assert low.bound(roof) == "memory" and high.bound(roof) == "compute"
    assert low.bound(roof, overhead_s=10.0) == "overhead"
    assert rl.OpCost("copy_", "", "", 1, 0.0, 8.0, 1.0).bound(roof) == "data movement"
    shares = rl.time_shares([low, high], roof)
    assert shares == {"memory": 0.5, "compute": 0.5}


def test_the_tokens_at_which_a_matmul_turns_compute_bound():
    for d_in, d_out, ridge, size in ((768, 768, 295.3, 2), (4096, 14336, 295.3, 2), (64, 64, 10.0, 4)):
        t = rl.compute_bound_tokens(d_in, d_out, ridge, size)
        assert rl.matmul_intensity(t, d_in, d_out, size) >= ridge > rl.matmul_intensity(t - 1, d_in, d_out, size)
    assert rl.compute_bound_tokens(64, 64, 295.3, 2) is None  # the activations grow as fast as the FLOPs
    # with d much wider than the batch, a bf16 matmul's intensity is about the batch (How to Scale Your Model)
    assert abs(rl.matmul_intensity(256, 65536, 65536, 2) - 256) < 2


def test_a_point_predicted_on_another_part_takes_the_roofs_time():
    roof = rl.Roof("part", 1000.0, 50.0)
    op = rl.OpCost("mm", "", "", 2, 1000.0, 100.0, 7.0)
    (moved,) = rl.predicted_on(roof, [op], bytes_scale=0.5)
    assert moved.nbytes == 50.0 and moved.time_s == 1.0 and moved.flops_per_s == 1000.0


def test_two_versions_of_an_operator_timed_side_by_side():
    a, b = torch.randn(32, 32), torch.randn(32, 32)
    candidates = {"matmul": lambda: a @ b, "sum": lambda: a.sum()}
    counts = {label: rl.counted_call(fn) for label, fn in candidates.items()}
    assert counts["matmul"] == (rl.matmul_flops(32, 32, 32), rl.matmul_bytes(32, 32, 32, 4))
    pair = rl.side_by_side(candidates, counts, rounds=3, timings=3, window_s=0.001, threads=1)
    assert [len(pair.rounds[label]) for label in candidates] == [3, 3]
    assert all(len(run) == 3 for runs in pair.rounds.values() for run in runs)
    assert pair.ops["matmul"].flops == counts["matmul"][0] and pair.ops["sum"].time_s > 0
    assert pair.interval("sum", "matmul").rounds == 3
    assert pair.sentence("sum", "matmul").startswith("sum ")
