"""Predict beyond the ranks in hand: memory, step time, tokens/s and MFU per GPU for GPUs that are not here.

    parts       the hardware table (dense peaks per dtype, memory, links; each figure with its source)
    shapes      model shapes by name (GPT-2, Llama 3) or read from a preset, a GPTConfig, a transformers config
    collectives α-β ring costs of all-reduce, all-gather, reduce-scatter, broadcast, send/recv; NCCL's tree for
                an all-reduce where it is faster
    cost        the efficiency factors, the collectives each mode issues, the overlap rules, the bubble
    calibrate   microbenchmarks on this machine: the "this-cpu" part
    ops         operators per training step (what a CPU pays per operator)
    step        predict(): the whole prediction, with its assumptions
    search      plan_for(): every parallel plan predicted, those that fit ranked by tokens/s per GPU, and why
"""

import sys

from .calibrate import calibrate
from .cost import PUBLISHED, Efficiency, Layout
from .parts import PARTS, Cluster, Part, gpus, part, register
from .search import Plan, PlanSearch, plan_for
from .shapes import PUBLIC, ModelShape, hf_config, shape_of
from .step import Prediction, predict, predict_decode

__all__ = ["predict", "predict_decode", "calibrate", "Prediction", "Part", "PARTS", "register", "part", "gpus",
           "Cluster", "Efficiency", "PUBLISHED", "Layout", "PUBLIC", "ModelShape", "shape_of", "hf_config",
           "plan_for", "PlanSearch", "Plan"]


class _CallableModule(sys.modules[__name__].__class__):
    """`scalekit.predict(model, gpus=...)` calls `predict`, while `scalekit.predict.<module>` stays this package."""

    def __call__(self, *args, **kwargs):
        return predict(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
