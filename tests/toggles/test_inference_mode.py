"""inference_mode: torch.inference_mode for the decode loop: the same logits and the same greedy tokens,
bit for bit."""

from __future__ import annotations

import pytest
import torch

from scalekit.models import GPT, load_pretrained
from tests.helpers import greedy, one_thread


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def model() -> GPT:
    return load_pretrained("shakespeare-char")


def test_inference_mode_gives_bit_identical_logits_and_tokens(model):
    x = torch.randint(0, 65, (3, 100))
    with torch.no_grad():
        a = model(x)[0]
    with torch.inference_mode():
        b = model(x)[0]
    assert torch.equal(a, b)
    assert greedy({"inference_mode": True, "kv_cache": "static"}).token_ids == greedy({"kv_cache": "static"}).token_ids
