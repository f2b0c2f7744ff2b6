"""The mixture-of-experts layer (scalekit.models.moe): the same outputs and gradients as a loop over tokens and
choices, nothing dropped with room for every token, the dropped count a hand count gives with little room, the
load-balance loss's value at its extremes, and a built-in GPT trained with MoE blocks."""

from __future__ import annotations

import copy

import pytest
import torch

from scalekit.models.gpt import GPT, GPTConfig
from scalekit.models.moe import MoE, capacity_of, expert_loop, moe_gpt, routings


@pytest.mark.parametrize("top_k", [1, 2])
@pytest.mark.parametrize("capacity_factor", [None, 1.0, 0.5])
@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_moe_equals_a_loop_over_tokens_and_experts(top_k, capacity_factor, activation):
    torch.manual_seed(0)
    moe = MoE(8, 16, experts=4, top_k=top_k, capacity_factor=capacity_factor, activation=activation)
    loop = copy.deepcopy(moe)
    x = torch.randn(3, 7, 8)
    out = moe(x)
    ref = expert_loop(loop, x).reshape(x.shape)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    out.square().sum().backward()
    ref.square().sum().backward()
    for (name, a), b in zip(moe.named_parameters(), loop.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("top_k", [1, 2])
def test_room_for_every_token_drops_none(top_k):
    torch.manual_seed(1)
    moe = MoE(8, 16, experts=4, top_k=top_k, capacity_factor=4.0 / top_k)  # capacity = all tokens
    moe(torch.randn(40, 8))
    r = moe.last
    assert r.capacity == 40 and r.dropped == 0
    assert int(r.tokens_per_expert.sum()) == 40 * top_k


def test_dropped_count_is_the_hand_count():
    # a router that sends every token's first choice to expert 0 and its second to expert 1
    moe = MoE(4, 8, experts=4, top_k=2, capacity_factor=1.0)
    with torch.no_grad():
        moe.router.weight.copy_(torch.tensor([[0.0, 0, 0, 2], [0, 0, 0, 1], [0, 0, 0, 0], [0, 0, 0, -1]]))
    x = torch.zeros(10, 4)
    x[:, 3] = 1.0
    moe(x)
    r = moe.last
    # capacity = ceil(1.0 * 10 tokens * 2 choices / 4 experts) = 5: experts 0 and 1 each take 5 of their 10
    assert r.capacity == capacity_of(10, 4, 2, 1.0) == 5
    assert r.dropped == 10
    assert r.chosen_per_expert.tolist() == [10, 10, 0, 0]
    assert r.tokens_per_expert.tolist() == [5, 5, 0, 0]
    assert r.kept.view(2, 10)[:, :5].all() and not r.kept.view(2, 10)[:, 5:].any()  # first tokens first


def test_balance_loss_is_one_when_uniform_and_e_when_collapsed():
    moe = MoE(4, 8, experts=4, top_k=1, capacity_factor=None)
    torch.nn.init.zeros_(moe.router.weight)  # uniform probabilities; ties go to the lowest index, so f is one-hot
    moe(torch.randn(16, 4))
    assert moe.last.aux_loss.item() == pytest.approx(1.0)  # 4 * (1 * 1/4)
    with torch.no_grad():
        moe.router.weight[0, 0] = 100.0
    moe(torch.ones(16, 4))
    assert moe.last.aux_loss.item() == pytest.approx(4.0, rel=1e-3)  # every token and all probability on one


def test_aux_weight_trains_the_balance_loss_without_changing_the_output():
    torch.manual_seed(2)
    plain = MoE(8, 16, experts=4, top_k=2, capacity_factor=None)
    weighted = copy.deepcopy(plain)
    weighted.aux_weight = 0.5
    x = torch.randn(12, 8)
    torch.testing.assert_close(plain(x), weighted(x))
    (plain(x).sum() + 0.5 * plain.last.aux_loss).backward()  # the loss added: what aux_weight's gradient equals
    weighted(x).sum().backward()
    torch.testing.assert_close(weighted.router.weight.grad, plain.router.weight.grad)
    copied = copy.deepcopy(weighted)  # after a forward that kept its routing: the copy keeps the values, no graph
    assert copied.last.aux_loss.grad_fn is None and copied.last.dropped == weighted.last.dropped


def test_a_moe_gpt_trains_and_reports_its_routing():
    torch.manual_seed(3)
    model = moe_gpt(GPT(GPTConfig(block_size=16, vocab_size=32, n_layer=2, n_head=2, n_embd=16)), experts=4, top_k=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    idx = torch.randint(0, 32, (4, 16))
    losses = []
    for _ in range(5):
        _, loss = model(idx, idx)
        losses.append(loss.item())
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert losses[-1] < losses[0]
    assert len(routings(model)) == 2 and all(r.chosen_per_expert.sum() == 4 * 16 * 2 for r in routings(model))
