"""Muon for the repeated blocks' 2-D weight matrices, AdamW for everything else, as one optimizer.

Muon (Keller Jordan, 2024) orthogonalizes each matrix's momentum with a few Newton-Schulz iterations; it is
defined for hidden weight matrices only, so its users pair it with AdamW for the embeddings, norms, biases and
the output head (Moonlight, modded-nanogpt).  `torch.optim.Muon` (torch ≥ 2.9) does the matrices; this class
holds both optimizers behind torch's Optimizer interface (one `state`, one list of `param_groups`, step hooks),
so the engine, the memory counters and checkpoints see a single optimizer.
"""

from __future__ import annotations

import torch

from .blocks import find_blocks


def block_matrix_ids(model: torch.nn.Module) -> set[int]:
    """ids of the 2-D parameters inside the model's repeated blocks (models.blocks.find_blocks): Muon's share."""
    blocks = find_blocks(model)
    if blocks is None:
        return set()
    return {id(p) for p in blocks.parameters() if p.ndim == 2}


class MuonWithAdamW(torch.optim.Optimizer):
    """torch.optim.Muon over `matrices`, torch.optim.AdamW over `others`, stepped together.

    Muon's learning rate is scaled per matrix to match AdamW's update RMS (Moonshot's `match_rms_adamw`,
    0.2·√max(rows, cols)), so one `lr` serves both; both decay weights by `weight_decay`.
    """

    def __init__(self, matrices: list, others: list, lr: float, weight_decay: float = 0.01):
        if not matrices:
            raise ValueError("MuonWithAdamW needs at least one 2-D matrix for Muon")
        self.muon = torch.optim.Muon(matrices, lr=lr, weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw")
        self.adamw = torch.optim.AdamW(others, lr=lr, weight_decay=weight_decay) if others else None
        super().__init__([*matrices, *others], {"lr": lr})
        self._link()

    def _link(self) -> None:
        """One state and one list of groups, shared with the two optimizers inside (groups are the same dicts)."""
        inner = [self.muon] + ([self.adamw] if self.adamw is not None else [])
        if len(self.param_groups) == len(inner):  # after load_state_dict: the loaded groups, in the same order
            for opt, group in zip(inner, self.param_groups, strict=True):
                group.update({k: v for k, v in opt.param_groups[0].items() if k not in group})
                opt.param_groups = [group]
        self.param_groups = [g for opt in inner for g in opt.param_groups]
        for opt in inner:
            opt.state = self.state

    def load_state_dict(self, state_dict) -> None:
        super().load_state_dict(state_dict)
        self._link()

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.muon.step()
        if self.adamw is not None:
            self.adamw.step()
        return loss


def muon_with_adamw(model: torch.nn.Module, params: list, lr: float) -> MuonWithAdamW:
    """Split `params` (what trains) into the blocks' 2-D matrices (Muon) and the rest (AdamW)."""
    ids = block_matrix_ids(model)
    matrices = [p for p in params if id(p) in ids]
    return MuonWithAdamW(matrices, [p for p in params if id(p) not in ids], lr=lr)
