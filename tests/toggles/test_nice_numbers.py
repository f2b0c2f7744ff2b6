"""nice_numbers: the vocabulary padded to a round size, the padding never predicted; refused where the run
starts from the shipped weights, whose shape it would change."""

from __future__ import annotations

import torch

from scalekit import run
from scalekit.models import GPT, GPTConfig
from tests.finetuning import ft
from tests.helpers import built, tiny


def test_nice_numbers_pads_vocab_and_padding_gets_no_probability():
    with built(tiny(toggles=["nice_numbers"], batch_size=6)) as ctx:
        g = ctx.base_model.config
        assert g.vocab_size == 65 and g.padded_vocab_size == 128 and g.padded_vocab_size % 64 == 0
        assert ctx.base_model.lm_head.weight.shape[0] == 128
        assert any("batch_size=6 is not a multiple of 8" in n for n in ctx.notes)
    # the same weights with and without padding give the same loss: padded rows carry no probability
    torch.manual_seed(0)
    plain = GPT(GPTConfig(block_size=16, vocab_size=65, n_layer=1, n_head=2, n_embd=32))
    padded = GPT(GPTConfig(block_size=16, vocab_size=65, padded_vocab_size=128, n_layer=1, n_head=2, n_embd=32))
    state = plain.state_dict()
    padded_state = padded.state_dict()
    for k, v in state.items():
        if v.shape == padded_state[k].shape:
            padded_state[k] = v
        else:  # embedding rows: real rows copied, padded rows left random (they must not matter)
            padded_state[k][:65] = v
    padded.load_state_dict(padded_state)
    idx = torch.randint(0, 65, (4, 16))
    (_, loss_plain), (logits, loss_padded) = plain(idx, idx), padded(idx, idx)
    torch.testing.assert_close(loss_padded, loss_plain)
    assert logits.shape[-1] == 65
    loss_padded.backward()
    assert torch.count_nonzero(padded.lm_head.weight.grad[65:]) == 0  # padded rows learn nothing
    out = padded.generate(idx[:, :4], max_new_tokens=40, generator=torch.Generator().manual_seed(0))
    assert int(out.max()) < 65  # sampling never picks a padded id


def test_nice_numbers_cannot_start_from_the_pretrained_weights():
    result = run(ft({"nice_numbers": True}, steps=1, warmup_steps=0), catch_errors=True)
    assert result.status == "failed" and "does not have the shipped model's shape" in result.error
