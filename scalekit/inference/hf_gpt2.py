"""The built-in GPT's weights in transformers' GPT2LMHeadModel: a peer implementation to check against.

The built-in GPT has GPT-2's layout (wte, wpe, blocks of ln_1 / attn.c_attn / attn.c_proj / ln_2 / mlp.c_fc /
mlp.c_proj, ln_f, an output head tied to wte), with one difference in storage: transformers' GPT-2 uses
`Conv1D`, whose weight is (in_features, out_features), the transpose of nn.Linear's.  GELU is the tanh
approximation in both ("gelu_pytorch_tanh" is exactly nn.GELU(approximate="tanh")); dropout is off.
transformers is imported only here, when a peer is asked for.
"""

from __future__ import annotations

import torch

from ..models.gpt import GPT
from ..optional import quiet_import

CONV1D = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")  # transposed in transformers' GPT-2


def gpt2_config(model: GPT, attn_implementation: str = "sdpa"):
    """A transformers GPT2Config of the built-in GPT's shape ("sdpa" or "eager" attention in transformers)."""
    GPT2Config = quiet_import("transformers").GPT2Config  # noqa: N806 (a class)

    c = model.config
    return GPT2Config(vocab_size=c.embedding_rows, n_positions=c.block_size, n_embd=c.n_embd, n_layer=c.n_layer,
                      n_head=c.n_head, activation_function="gelu_pytorch_tanh", resid_pdrop=0.0, embd_pdrop=0.0,
                      attn_pdrop=0.0, layer_norm_epsilon=1e-5, tie_word_embeddings=True, bos_token_id=None,
                      eos_token_id=None, pad_token_id=None, attn_implementation=attn_implementation)


def gpt2_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """The built-in GPT's weights as GPT2LMHeadModel's state dict (the same names), Conv1D weights transposed."""
    if not model.config.bias:
        raise ValueError("transformers' GPT-2 has biases everywhere: a GPT built with bias=False has no peer there")
    out = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied to wte: transformers ties it back
        if name.endswith(".weight") and any(f".{part}." in name for part in CONV1D):
            tensor = tensor.t()  # nn.Linear (out, in) -> Conv1D (in, out)
        out[name] = tensor.detach().clone().contiguous()  # the names are GPT-2's already
    return out


def to_gpt2lmhead(model: GPT, attn_implementation: str = "sdpa"):
    """A transformers GPT2LMHeadModel holding `model`'s weights, in eval mode, on `model`'s device."""
    GPT2LMHeadModel = quiet_import("transformers").GPT2LMHeadModel  # noqa: N806 (a class)

    device = next(model.parameters()).device
    peer = GPT2LMHeadModel(gpt2_config(model, attn_implementation))
    missing, unexpected = peer.load_state_dict(gpt2_state_dict(model), strict=False)
    missing = [k for k in missing if k != "lm_head.weight" and not k.endswith(".attn.bias")
               and not k.endswith(".attn.masked_bias")]
    if missing or unexpected:
        raise RuntimeError(f"GPT-2 peer: weights not matched: missing {missing}, unexpected {unexpected}")
    peer.tie_weights()
    return peer.to(device).eval()

