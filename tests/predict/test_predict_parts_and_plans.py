"""The parts table, the specs it parses, the shapes by name, and predict's refusals and speed on the meta-free
public shapes (no GPU, no weights: figures from the numbers alone)."""

from __future__ import annotations

import time

import pytest

from scalekit.errors import ConfigError
from scalekit.predict import PARTS, Part, gpus, part, plan_for, predict, predict_decode, register
from scalekit.predict.collectives import ring_time
from scalekit.predict.cost import bubble_fraction
from scalekit.predict.shapes import PUBLIC, shape_of

REQUIRED = ("A100-40GB-SXM", "A100-80GB-SXM", "H100-SXM", "H100-PCIe", "H200", "B200", "L40S", "RTX-4090")


def test_every_required_part_has_dense_peaks_links_and_a_source_for_each():
    for name in REQUIRED:
        p = PARTS[name]
        assert {"fp32", "tf32", "bf16", "fp16"} <= set(p.peak_flops), name
        assert p.memory_bytes > 0 and p.memory_bandwidth > 0 and p.intra_bandwidth > 0 and p.inter_bandwidth > 0
        assert {"flops", "memory", "intra", "inter"} <= set(p.sources), name
    # dense, not sparse: H100 SXM bf16 989 TFLOP/s, A100 312 (the sparse figures are twice that)
    assert PARTS["H100-SXM"].peak("bf16") == pytest.approx(989.4e12)
    assert PARTS["A100-80GB-SXM"].peak("bf16") == 312e12
    assert "sparsity" in PARTS["H100-SXM"].sources["flops"]
    assert "fp8" not in PARTS["A100-80GB-SXM"].peak_flops


def test_specs_parse_into_nodes_of_eight_and_unknown_parts_are_named():
    c = gpus("64xH100-SXM")
    assert (c.count, c.per_node, c.nodes, c.part.name) == (64, 8, 8, "H100-SXM")
    assert gpus("h100").count == 1 and gpus("2 x a100").part.name == "A100-80GB-SXM"
    assert gpus("16xH200", per_node=4).nodes == 4
    with pytest.raises(ConfigError, match="unknown part 'TPU-v9'.*H100-SXM.*register"):
        part("TPU-v9")
    for count in ("0", "1048577", "99999999999999999999"):  # the last once hung plan_for, enumerating its divisors
        with pytest.raises(ConfigError, match="the count must be from 1 to 1,048,576"):
            gpus(f"{count}xH100")


def test_a_user_adds_a_part():
    mine = register(Part("MY-GPU", {"fp32": 1e12, "tf32": 2e12, "bf16": 4e12, "fp16": 4e12}, 16e9, 500e9,
                         "PCIe", 16e9, "Ethernet", 1e9, {"flops": "my sheet"}))
    try:
        assert gpus("4xmy-gpu").part is mine
        assert predict("gpt2-124m", "4xMY-GPU", toggles=["ddp", "bf16"], batch_size=8).step_s > 0
    finally:
        del PARTS["MY-GPU"]


def test_public_shapes_have_their_published_parameter_counts():
    assert shape_of("gpt2-124m").n_params == pytest.approx(124.4e6, rel=0.002)
    assert shape_of("gpt2-1.5b").n_params == pytest.approx(1.558e9, rel=0.002)
    assert shape_of("llama3-8b").n_params == pytest.approx(8.03e9, rel=0.002)
    assert shape_of("llama3-70b").n_params == pytest.approx(70.55e9, rel=0.002)
    assert shape_of("llama3-405b").n_params == pytest.approx(405.8e9, rel=0.003)
    assert shape_of("tiny").n_params == 108352  # the built-in preset, read off the meta device
    with pytest.raises(ConfigError, match="unknown model 'gpt5'.*llama3-8b"):
        shape_of("gpt5")


def test_a_built_model_is_predicted_as_its_config_and_a_plain_module_is_refused_saying_why():
    transformers = pytest.importorskip("transformers")
    import torch

    from scalekit.models import GPT, PRESETS

    config = transformers.LlamaConfig(hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=512)
    with torch.device("meta"):  # built as a user builds it (no weights needed here)
        built = transformers.LlamaForCausalLM(config)
    gpt = GPT(PRESETS["tiny"].gpt_config(64))
    for model, its_config in ((built, config), (gpt, gpt.config)):
        a, b = (predict(m, "2xH100-SXM", toggles=["ddp"], batch_size=4, seq_len=64) for m in (model, its_config))
        assert (a.step_s, a.memory) == (b.step_s, b.memory)
    with pytest.raises(ConfigError, match="cannot read a shape from Linear .*layers, widths and heads are not known"):
        predict(torch.nn.Linear(2, 2))


def test_the_ring_costs_and_the_bubble_follow_their_formulas():
    # all-reduce 2(n−1)/n·S/B + 2(n−1)α ; all-gather (n−1)/n·S/B + (n−1)α
    assert ring_time("all_reduce", 8e9, 1, 8, 1e9, 0.0) == pytest.approx(14.0)
    assert ring_time("all_gather", 8e9, 1, 8, 1e9, 1e-3) == pytest.approx(7.0 + 7e-3)
    assert ring_time("all_reduce", 8e9, 1, 1, 1e9, 1e-3) == 0.0
    assert bubble_fraction(4, 8, "1f1b") == pytest.approx(3 / 11)


def test_refusals_are_sentences_with_the_numbers():
    with pytest.raises(ConfigError, match="tensor_parallel 3 does not divide the model's 32 attention heads"):
        predict("llama3-8b", "6xH100-SXM", toggles={"tensor_parallel": 3, "bf16": True}, batch_size=2)
    with pytest.raises(ConfigError, match="5 stages do not divide the model's 32 layers"):
        predict("llama3-8b", "10xH100-SXM", toggles={"pipeline_parallel": "1f1b/8,stages=5"}, batch_size=16)
    with pytest.raises(ConfigError, match="= 16 does not divide 8 GPUs"):
        predict("llama3-8b", "8xH100-SXM", toggles={"tensor_parallel": 8, "pipeline_parallel": "1f1b/4,stages=2"})
    with pytest.raises(ConfigError, match="batch_size 3 does not split into 8 data-parallel ranks"):
        predict("llama3-8b", "8xH100-SXM", toggles=["fsdp"], batch_size=3)
    with pytest.raises(ConfigError, match=r"does not fit: the plan needs \d+\.\d GiB per GPU and a RTX-4090 has"):
        predict("llama3-70b", "1xRTX-4090", toggles=["bf16"], batch_size=1, seq_len=2048, strict=True)


def test_a_toggle_predict_does_not_know_or_a_value_its_toggle_refuses_is_refused_naming_it():
    # zero='zero9' once went through as a sharding the cost model prices as none
    with pytest.raises(ConfigError, match=r"toggles\['zero'\] must be True or one of 'zero1', 'zero2'; got 'zero9'"):
        predict("gpt2-124m", "8xH100-SXM", toggles={"zero": "zero9"})
    with pytest.raises(ConfigError, match="unknown toggle 'fdsp'; the known ones are .*fsdp"):
        plan_for("gpt2-124m", "8xH100-SXM", toggles=["fdsp"])
    for name in ("grad_accum", "context_parallel"):  # '²' once reached int() and raised ValueError at the user
        for value in ("²", 0, -1, 1.5):
            with pytest.raises(ConfigError, match=rf"toggles\['{name}'\] must be True or a whole number of at least 1"):
                predict("gpt2-124m", "8xH100-SXM", toggles={"fsdp": True, name: value})
    # a schedule the pipeline toggle refuses once reached int() ('1f1b/16/2') or divided by zero ('gpipe/0')
    for value in ("1f1b/16/2", "gpipe/0", "zigzag"):
        with pytest.raises(ConfigError, match=r"toggles\['pipeline_parallel'\] must be True, 'gpipe', '1f1b'"):
            predict("gpt2-124m", "8xH100-SXM", toggles={"pipeline_parallel": value})
    with pytest.raises(ConfigError, match=r"toggles\['tensor_parallel'\] must be True \(= 2\) or a positive"):
        predict("gpt2-124m", "8xH100-SXM", toggles={"fsdp": True, "tensor_parallel": 0})
    # True is the toggle's own default, as a run reads it: tensor_parallel 2, pipeline_parallel 1f1b (it raised)
    assert predict("gpt2-124m", "8xH100-SXM", toggles={"fsdp": True, "tensor_parallel": True}).layout.tp == 2
    assert predict("gpt2-124m", "2xH100-SXM", toggles={"pipeline_parallel": True}, batch_size=8).layout.schedule == "1f1b"
    assert "grad_accum 2 given, not kept" in " ".join(plan_for("gpt2-124m", "8xH100-SXM", toggles=["grad_accum=2"]).notes)
    assert predict("gpt2-124m", "8xH100-SXM", toggles={"fsdp": True, "checkpointing": "selective-torchtitan",
                                                       "context_parallel": 2}).layout.cp == 2


@pytest.mark.parametrize("sizes", [{"seq_len": 0}, {"batch_size": 0}, {"seq_len": 2**24 + 1}, {"batch_size": 10**20},
                                   {"seq_len": 1.5}, {"batch_size": True}])
def test_a_size_out_of_range_is_refused_before_anything_is_counted_not_taken_for_the_default(sizes):
    # 0 once fell back to the default (1024 tokens) as if not given; 10**20 once overflowed torch building the model
    (name, value), = sizes.items()
    for call in (predict, plan_for):
        with pytest.raises(ConfigError, match=f"{name} must be a whole number from 1 to 16,777,216.*got {value!r}"):
            call("gpt2-124m", "8xH100-SXM", **sizes)


def test_a_405b_model_on_512_gpus_is_predicted_in_well_under_five_seconds():
    start = time.perf_counter()
    p = predict("llama3-405b", "512xH100-SXM", toggles={"fsdp": True, "bf16": True, "tensor_parallel": 8,
                                                         "pipeline_parallel": "1f1b/16,stages=2", "sdpa": True,
                                                         "checkpointing": "selective"}, batch_size=512, seq_len=8192)
    assert time.perf_counter() - start < 5
    assert (p.layout.dp, p.layout.tp, p.layout.pp) == (32, 8, 2)
    kinds = {c.op for c in p.collectives}
    assert kinds == {"all_gather", "reduce_scatter", "all_reduce", "send_recv", "broadcast"}  # (the loss, last stage)
    tp = next(c for c in p.collectives if c.op == "all_reduce")
    assert tp.link == "NVLink 4"  # a tensor-parallel group of 8 sits in one node
    fsdp = next(c for c in p.collectives if c.op == "reduce_scatter")
    assert fsdp.link.startswith("InfiniBand")  # 32 data-parallel ranks, 8 apart, span nodes
    assert p.bubble_s > 0 and p.tokens_per_s_per_gpu > 0 and 0 < p.mfu < 1
    assert any(a.startswith("overlap FSDP_PREFETCH") for a in p.assumptions)


def test_every_figure_comes_with_its_assumptions():
    p = predict("llama3-8b", "8xH100-SXM", toggles=["fsdp", "bf16", "sdpa"], batch_size=16, seq_len=8192)
    assert set(p.memory) == {"params", "grads", "optimizer_state", "activations", "comm_buffers", "peak"}
    text = p.table()
    for words in ("memory per GPU", "exposed communication", "tokens/s per GPU", "MFU", "MAMF", "Korthikanti"):
        assert words in text
    decode = predict_decode("llama2-7b", "A100-80GB-SXM")
    assert decode["ceiling_tokens_per_s"] == pytest.approx(2039e9 / (PUBLIC["llama2-7b"].n_params * 2))
    assert decode["tokens_per_s"] < decode["ceiling_tokens_per_s"]


def test_the_command_line_prints_the_prediction_and_refuses_in_a_sentence(capsys):
    from scalekit.cli.main import main

    assert main(["predict", "llama3-8b", "--gpus", "16xH100-SXM", "--toggle", "fsdp", "--toggle", "bf16",
                 "--toggle", "checkpointing=selective", "--batch-size", "16", "--seq-len", "4096"]) == 0
    out = capsys.readouterr().out
    assert "16× H100-SXM (2 nodes of 8)" in out and "InfiniBand" in out and "tokens/s per GPU" in out
    assert main(["predict", "llama3-8b", "--gpus", "6xH100", "--toggle", "tensor_parallel=4"]) == 2
    assert "= 4 does not divide 6 GPUs" in capsys.readouterr().err


def test_a_part_measured_here_that_cannot_fork_its_ranks_is_refused_in_one_line_naming_gpus(capsys):
    # calibrate() starts ranks; a process that has imported bitsandbytes cannot fork them (scalekit.launch says why)
    pytest.importorskip("bitsandbytes")  # imported inside the test: the forking tests ran before it
    from scalekit.cli.main import main

    for command in ("predict", "plan-for"):
        assert main([command, "gpt2-124m", "--gpus", "CPU"]) == 2
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("scalekit: error: --gpus CPU: measuring this machine"), lines


def test_context_parallel_splits_every_sequence_and_passes_k_v_around_its_ring():
    long = dict(toggles={"fsdp": True, "bf16": True, "sdpa": True, "checkpointing": "selective"}, seq_len=32768)
    with pytest.raises(ConfigError, match="batch_size 4 does not split into 8 data-parallel ranks"):
        predict("llama3-8b", "8xH100-SXM", batch_size=4, **long)
    whole = predict("llama3-8b", "4xH100-SXM", batch_size=4, **long)  # one sequence per GPU
    split = predict("llama3-8b", "8xH100-SXM", batch_size=4, **{**long, "toggles": {**long["toggles"],
                                                                                  "context_parallel": 2}})
    assert (split.layout.dp, split.layout.cp, split.layout.grad_ranks) == (4, 2, 8)
    # half of each sequence per GPU: half the activations (fused attention: linear in the tokens)
    assert split.memory["activations"] == pytest.approx(whole.memory["activations"] / 2, rel=0.01)
    shape = shape_of("llama3-8b")
    ring = next(c for c in split.collectives if c.overlap_rule == "RING_OVERLAP")
    kv_shard = 2 * 1 * (32768 // 2) * shape.n_kv_head * (shape.d // shape.n_head) * 2  # K and V, bf16, one row
    assert (ring.op, ring.ranks) == ("send_recv", 2)
    assert ring.bytes == 3 * (2 - 1) * shape.n_layer * kv_shard  # forward K/V; backward K/V and their gradients
    assert 0 <= ring.exposed_s <= ring.time_s
    assert all(c.ranks == 8 for c in split.collectives if c.op in ("all_gather", "reduce_scatter"))
    with pytest.raises(ConfigError, match="seq_len 8196 does not divide into 8"):
        predict("llama3-8b", "8xH100-SXM", batch_size=2, seq_len=8196,
                toggles={"fsdp": True, "context_parallel": 4})
