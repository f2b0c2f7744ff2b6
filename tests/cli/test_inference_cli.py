"""`scalekit generate` and `scalekit ladder inference`, and the inference ladder's climbing rules."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from scalekit.cli.main import main
from scalekit.inference import GenerateConfig, inference_ladder
from scalekit.inference.ladder import INFERENCE_LADDER, first_available
from scalekit.training.ladder import LADDERS
from tests.helpers import CPU, library_lines, one_thread


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


def test_generate_prints_the_text_and_the_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "g.json"
    code = main(["generate", "--prompt", "ROMEO:", "--prompt", "JULIET:", "--max-new-tokens", "20", "--toggle",
                 "kv_cache=static", "--toggle", "quantize=hqq-4bit", "--device", "cpu", "--json", str(out)])
    assert code == 0
    printed = capsys.readouterr()
    assert "ROMEO:" in printed.out and "JULIET:" in printed.out
    for word in ("decode tok/s", "ms/token", "TTFT ms", "weights MB", "KV MB", "perplexity", "agree",
                 "kv_cache=static + quantize=hqq-4bit", "3.56 →"):
        assert word in printed.out, word
    assert "generating 20 tokens × 2 prompt(s)" in printed.err
    doc = json.loads(out.read_text())
    assert doc["config"]["toggles"] == {"kv_cache": "static", "quantize": "hqq-4bit"}
    assert len(doc["token_ids"]) == 2 and len(doc["token_ms"]) == 19


@pytest.mark.parametrize("argv,words", [
    (["generate", "--max-new-tokens", "5000"], "at most 1018 new tokens (flag: --max-new-tokens"),
    (["generate", "--toggle", "fused_adamw"], "applies to training, not to generation"),
    (["generate", "--prompt", "ünïcode"], "(flag: --prompt)"),
    (["generate", "--model", "huge"], "unknown model 'huge'"),
    (["generate", "--temperature", "-2"], "GenerateConfig.temperature"),
    (["generate", "--toggle", "quantize=gptq"], "CUDA GPUs only"),
    (["ladder", "inference", "--steps", "3"], "--steps set how training is measured"),
])
def test_bad_input_exits_2_with_a_message_not_a_traceback(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_the_inference_ladder_is_registered():
    assert LADDERS["inference"] is inference_ladder
    assert [label for label, _ in INFERENCE_LADDER] == ["+ inference_mode", "+ kv_cache", "+ static cache + compile",
                                                        "+ bf16", "+ int8", "+ 4-bit", "+ int8 KV cache",
                                                        "+ speculative (draft), no compile",
                                                        "+ prompt lookup instead of the draft"]


def test_a_rung_this_machine_cannot_run_is_skipped_with_the_reason_and_the_climb_goes_on():
    rungs = (("+ kv_cache", {"kv_cache": "dynamic"}), ("+ calibrated", {"quantize": ("gptq", "awq")}),
             ("+ hqq", {"quantize": ("gptq", "hqq-4bit")}))
    base = GenerateConfig(max_new_tokens=12, warmup_tokens=0, measure_memory=False, device="cpu")
    rows = inference_ladder(base, rungs=rungs)
    assert [r.label for r in rows] == ["baseline", "+ kv_cache", "+ calibrated", "+ hqq"]
    assert rows[2].status == "skipped" and "CUDA" in rows[2].error
    assert rows[3].status == "ok" and rows[3].config["toggles"] == {"kv_cache": "dynamic", "quantize": "hqq-4bit"}
    assert rows[1].token_ids == rows[0].token_ids  # the cache changes the speed, not the tokens
    assert first_available(("gptq", "awq"), CPU)[0] is None


@pytest.mark.slow
def test_ladder_inference_end_to_end_in_a_fresh_process(tmp_path):
    out = tmp_path / "ladder.json"
    proc = subprocess.run([sys.executable, "-m", "scalekit.cli.main", "ladder", "inference", "--max-new-tokens", "12",
                           "--quality-seq-len", "64", "--model", "tiny", "--device", "cpu", "--repeats", "1", "--json", str(out)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [r["label"] for r in rows] == ["baseline", "+ inference_mode", "+ kv_cache", "+ static cache + compile",
                                          "+ bf16", "+ int8", "+ 4-bit", "+ int8 KV cache",
                                          "+ speculative (draft), no compile", "+ prompt lookup instead of the draft"]
    assert all(r["status"] == "ok" for r in rows), [(r["label"], r["error"]) for r in rows]
    # cumulative, one quantization at a time
    assert rows[5]["config"]["toggles"] == {"bf16": True, "kv_cache": "static", "quantize": "torchao-int8",
                                            "compile": "default", "inference_mode": True}
    assert rows[6]["config"]["toggles"]["quantize"] == "hqq-4bit"
    assert rows[6]["weight_bytes"] < rows[5]["weight_bytes"] < rows[0]["weight_bytes"]
    assert rows[3]["graphs_compiled"] == 1 and rows[3]["recompiles_measured"] == 0
    assert rows[7]["config"]["toggles"]["kv_cache"] == "static-int8" and rows[7]["kv_cache_bytes"] < rows[6]["kv_cache_bytes"]
    assert "compile" not in rows[8]["config"]["toggles"] and rows[8]["config"]["toggles"]["speculative"] == "draft"
    assert rows[9]["config"]["toggles"]["speculative"] == "prompt_lookup" and rows[9]["acceptance_rate"] is not None
    for word in ("decode tok/s", "speed-up", "weights MB", "KV MB", "perplexity"):
        assert word in proc.stdout
    # nothing but scalekit's words, cold compiles of torchao's int8 and hqq's 4-bit layers included
    assert not library_lines(proc.stdout, proc.stderr), library_lines(proc.stdout, proc.stderr)
