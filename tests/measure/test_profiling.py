import itertools
import json

import pytest
import torch

from scalekit import RunConfig
from scalekit.training.profiling import STEP_RANGE, compiled_kernels, peak_bytes, profile_steps, time_ms


@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory):
    trace = tmp_path_factory.mktemp("trace") / "step.json"
    return profile_steps(RunConfig(preset="tiny", device="cpu"), steps=2, warmup_steps=1, trace_path=trace)


def test_trace_is_a_chrome_trace_with_one_range_per_step(tiny_profile):
    trace = json.loads(tiny_profile.trace_path.read_text())
    steps = [e for e in trace["traceEvents"] if e.get("name") == STEP_RANGE]
    assert len(steps) == 2
    assert all(e["dur"] > 0 for e in steps)


def test_self_times_account_for_the_whole_step(tiny_profile):
    # every op's self time is counted once, so on the CPU the categories add up to the host's step ranges,
    # which fit inside the wall-clock time of the profiled loop.  The ranges are read from the profiler's clock
    # (CPU cycle counts converted to time at a rate it estimated) and the loop from time.perf_counter: the two
    # clocks agree to a few tenths of a percent, not exactly (a busy CI machine once put the ranges 0.7% over)
    total = tiny_profile.by_category()["self_ms"].sum()
    assert total == pytest.approx(tiny_profile.host_step_ms, rel=0.01)
    assert tiny_profile.host_step_ms <= tiny_profile.step_ms * 1.02
    assert tiny_profile.ops["share"].sum() == pytest.approx(1.0)


def test_ops_land_in_the_expected_categories(tiny_profile):
    cat = dict(zip(tiny_profile.ops["op"], tiny_profile.ops["category"], strict=True))
    assert cat["aten::addmm"] == "matmul"
    assert cat["Optimizer.step#AdamW.step"] == "optimizer step"
    assert cat["scalekit.data"] == "data loading"
    assert cat["aten::native_layer_norm"] == "layer norm"
    assert tiny_profile.top_ops(5).shape[0] == 5
    assert "Self CPU" in tiny_profile.table(5)


def test_profile_sees_the_toggles_of_the_run():
    prof = profile_steps(RunConfig(preset="tiny", device="cpu", toggles=["fused_adamw", "sdpa"]), steps=1,
                         warmup_steps=1)
    cat = dict(zip(prof.ops["op"], prof.ops["category"], strict=True))
    assert cat.get("aten::_fused_adamw_") == "optimizer step"
    assert any("scaled_dot_product" in op for op in cat)
    assert not any(op == "aten::masked_fill" for op in cat)  # the manual causal mask is gone


@pytest.mark.slow
def test_compile_fuses_an_elementwise_chain_into_one_kernel():
    def chain(x, w, b):
        return torch.nn.functional.gelu(x * w + b) * 0.5 + x

    x, w, b = torch.randn(64, 32), torch.randn(32), torch.randn(32)
    out, kernels = compiled_kernels(chain, x, w, b)
    assert torch.allclose(out, chain(x, w, b), atol=1e-6)
    assert len(kernels) == 1, kernels


def test_time_ms_counts_the_repetitions():
    calls = []
    spread = time_ms(lambda: calls.append(1), reps=7, warmup=3)
    assert len(calls) == 10 and spread.n == 7 and spread.median >= 0


def test_peak_bytes_sees_temporaries_freed_before_the_end():
    def fn():
        big = torch.ones(256, 1024)  # 1 MiB, freed when fn returns
        return big.sum()

    peak = peak_bytes(fn)
    assert 2**20 <= peak < 2 * 2**20


def test_the_profiler_banner_stays_off_stderr_and_other_lines_do_not():
    # kineto writes "USDT:... profiler_start" to fd 2 from C++; a notebook shows it under the cell
    import subprocess
    import sys

    code = ("import os, torch\n"
            "from scalekit import RunConfig\n"
            "from scalekit.training.profiling import profile_steps, without_kineto_banner\n"
            "profile_steps(RunConfig(preset='tiny', device='cpu', threads=1), steps=1, warmup_steps=0)\n"
            "with without_kineto_banner():\n"
            "    os.write(2, b'USDT:2026 1:1 X.cpp:52] profiler_start\\nan error of the reader\\'s own\\n')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "profiler_start" not in done.stderr and "USDT" not in done.stderr
    assert "an error of the reader's own" in done.stderr


class ScriptedCalls:
    """Stands in for the step timer's clock (timing.time) and the load meter: each scripted call advances the
    clock by its time in ms, times a seeded jitter, and the meter reads the load the test gives."""

    def __init__(self, load_cores: float | None = 0.0, jitter: float = 0.03, seed: int = 0):
        import random

        from scalekit.measure.load import MachineLoad

        self.now, self.rng, self.jitter = 0.0, random.Random(seed), jitter
        self.load = MachineLoad(other_cpu_cores=load_cores, cores=2, wall_s=1.0)

    def perf_counter(self) -> float:
        return self.now

    def call(self, *ms: float):
        """A call taking ms[0], ms[1], ... in turn (round and round), each with its jitter."""
        turn = itertools.cycle(ms)

        def run():
            self.now += next(turn) * self.rng.lognormvariate(0, self.jitter) / 1e3
        return run

    def install(self, monkeypatch) -> None:
        from scalekit.measure import timing
        from scalekit.training import profiling

        monkeypatch.setattr(timing, "time", self)
        monkeypatch.setattr(profiling, "LoadMeter", lambda device_type: self)

    def read(self):
        return self.load


def test_call_finding_says_which_call_is_faster(monkeypatch):
    from scalekit.training.profiling import call_finding

    machine = ScriptedCalls()
    machine.install(monkeypatch)
    quick, slow = machine.call(2.0), machine.call(20.0)
    text, interval = call_finding("quick", quick, "slow", slow, reps=6, warmup=1)
    assert text.startswith("quick is faster than slow: ") and "at 95%" in text
    assert interval.low > 2  # 10× less time: even a busy machine cannot make that within noise
    text, interval = call_finding("slow", slow, "quick", quick, reps=6, warmup=1)
    assert text.startswith("slow is slower than quick") and interval.high < 0.5
    text, interval = call_finding("quick", quick, "slow", slow, reps=3, warmup=0)
    assert interval is None and "too few" in text  # no interval from three calls each, and it says so


def test_call_finding_on_real_sleeps_never_reverses_a_tenfold_difference():
    # the real clock, generously: 2 ms against 20 ms of sleep.  A busy machine may widen the interval past
    # WIDE_RATIO (then the sentence says unreliable), never turn it round
    import time

    from scalekit.training.profiling import call_finding

    text, interval = call_finding("quick", lambda: time.sleep(0.002), "slow", lambda: time.sleep(0.02), reps=6,
                                  warmup=1)
    assert interval.low > 2
    assert text.startswith(("quick is faster than slow: ", "quick against slow: unreliable (interval too wide)"))


def test_call_finding_alternates_the_calls_and_turns_the_order_each_pair(monkeypatch):
    from scalekit.training.profiling import call_finding

    machine, order = ScriptedCalls(), []
    machine.install(monkeypatch)
    a, b = machine.call(1.0), machine.call(1.0)
    call_finding("a", lambda: (order.append("a"), a()), "b", lambda: (order.append("b"), b()), reps=6, warmup=1)
    assert "".join(order) == "ba" + "ba" + "ab" + "ba" + "ab" + "ba" + "ab"  # warm-up, then turning every pair


def test_call_finding_too_wide_an_interval_reads_unreliable_and_says_why(monkeypatch):
    from scalekit.measure.reliability import WIDE_RATIO
    from scalekit.training.profiling import call_finding

    machine = ScriptedCalls()
    machine.install(monkeypatch)
    steady, erratic = machine.call(10.0), machine.call(4.0, 4.0, 4.0, 1.0, 1.0, 1.0)  # 4 ms, then 1 ms, by turns
    text, interval = call_finding("erratic", erratic, "steady", steady, reps=18, warmup=0)
    assert interval.low > 1 and interval.high / interval.low > WIDE_RATIO  # faster, by how much not known
    assert text.startswith("erratic against steady: unreliable (interval too wide), ")
    assert f"a factor of {interval.high / interval.low:.1f}, more than {WIDE_RATIO:g}" in text
    assert "calls alternating" in text and "the calls varied too much" in text
    assert "faster" not in text and "slower" not in text
    assert text.endswith("time more calls of each (a larger reps), on a quieter machine if it was busy")


def test_call_finding_on_a_busy_machine_keeps_its_verdict_and_names_the_load(monkeypatch):
    # the calls alternate, so the load falls on both (the rule of paired rounds): the verdict stands, and the
    # sentence says the machine was busy and how busy
    from scalekit.training.profiling import call_finding

    machine = ScriptedCalls(load_cores=1.5)
    machine.install(monkeypatch)
    text, interval = call_finding("quick", machine.call(2.0), "slow", machine.call(20.0), reps=6, warmup=1)
    assert interval.busy and interval.verdict == "faster"
    assert text.startswith("quick is faster than slow: ")
    assert text.endswith("calls alternating); the machine was busy (the calls alternated, so the load fell on "
                         "both); other processes used 1.50 of 2 cores while quick and slow were timed")


def test_call_finding_on_a_quiet_machine_says_faster_or_slower_alone(monkeypatch):
    from scalekit.training.profiling import call_finding

    machine = ScriptedCalls(load_cores=0.1)
    machine.install(monkeypatch)
    text, interval = call_finding("quick", machine.call(2.0), "slow", machine.call(20.0), reps=6, warmup=1)
    assert not interval.busy and text.startswith("quick is faster than slow: ") and text.endswith("alternating)")
    text, interval = call_finding("slow", machine.call(20.0), "quick", machine.call(2.0), reps=6, warmup=1)
    assert text.startswith("slow is slower than quick: ") and "busy" not in text


def test_attention_is_counted_by_module_in_a_model_we_did_not_write():
    # GPT-2 from transformers (eager attention): its QK^T and AV are aten::bmm calls inside GPT2Attention, two per
    # layer forward and four in the backward; named by the op alone they would be matmuls
    from scalekit.training.profiling import module_ranges
    from tests.families import hf_model

    model = hf_model("gpt2")
    prof = profile_steps(RunConfig(model=model, seq_len=32, batch_size=2, device="cpu", threads=1), steps=1,
                         warmup_steps=1)
    ops = prof.ops
    bmm = ops[ops["op"] == "aten::bmm"]
    assert set(bmm["category"]) == {"attention"}
    assert bmm["calls"].sum() == 6 * model.config.n_layer  # forward and backward, every layer
    assert {"aten::_softmax", "aten::_softmax_backward_data"} <= set(ops[ops["category"] == "attention"]["op"])
    assert set(ops[ops["op"] == "aten::addmm"]["category"]) == {"matmul"}  # the projections stay matmuls
    cats = prof.by_category().set_index("category")
    assert cats.loc["attention", "self_ms"] >= bmm["self_ms"].sum()
    with module_ranges(model) as hooked:  # the hooks go when the profile ends
        assert hooked == 3 * model.config.n_layer  # each layer's attention, its c_attn and its c_proj
        assert model.transformer.h[0].attn._forward_hooks
    assert not model.transformer.h[0].attn._forward_hooks and not model.transformer.h[0].attn._forward_pre_hooks
