"""scalekit's generation checked against a peer implementation: the built-in GPT's weights in transformers'
GPT2LMHeadModel (Conv1D weights transposed) give the same logits and the same greedy tokens."""

from __future__ import annotations

import pytest
import torch

from scalekit.inference import generate
from scalekit.inference.config import corpus_tokenizer
from scalekit.models import GPT, PRESETS, load_pretrained
from tests.helpers import CPU, one_thread

transformers = pytest.importorskip("transformers", reason="the peer check needs transformers (a scalekit dependency)")

from scalekit.inference.hf_gpt2 import gpt2_state_dict, to_gpt2lmhead  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_the_gpt2_peer_gives_the_same_logits(attn):
    model = load_pretrained()
    peer = to_gpt2lmhead(model, attn_implementation=attn)
    assert peer.config._attn_implementation == attn
    assert peer.lm_head.weight.data_ptr() == peer.transformer.wte.weight.data_ptr()  # tied, as in scalekit
    x = torch.randint(0, 65, (2, 300))
    with torch.no_grad():
        torch.testing.assert_close(peer(x).logits, model(x)[0], rtol=1e-4, atol=1e-4)


def test_conv1d_weights_are_the_linear_weights_transposed():
    model = GPT(PRESETS["tiny"].gpt_config())
    state = gpt2_state_dict(model)
    assert torch.equal(state["transformer.h.0.attn.c_attn.weight"], model.transformer.h[0].attn.c_attn.weight.t())
    assert state["transformer.h.1.mlp.c_fc.weight"].shape == (64, 256)
    assert "lm_head.weight" not in state  # tied back by transformers


@pytest.mark.parametrize("toggles", [{}, {"kv_cache": "static"}], ids=["no cache", "static cache"])
def test_scalekit_generation_gives_transformers_greedy_tokens(toggles):
    prompts = ["ROMEO:", "KING RICHARD III:\nNow"]
    ours = generate(prompts=prompts, max_new_tokens=60, toggles=toggles, quality=False, measure_memory=False,
                    warmup_tokens=0, device="cpu", hw=CPU)
    peer = to_gpt2lmhead(load_pretrained())
    tok = corpus_tokenizer()
    for prompt, ids in zip(prompts, ours.token_ids, strict=True):  # one prompt at a time: no padding on either side
        x = torch.tensor([tok.encode(prompt)])
        with torch.no_grad():  # an explicit mask: otherwise transformers takes pad_token_id's tokens ("\n") as padding
            out = peer.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=60, min_new_tokens=60,
                                do_sample=False, use_cache=True, pad_token_id=0)
        assert out[0, x.shape[1]:].tolist() == ids
