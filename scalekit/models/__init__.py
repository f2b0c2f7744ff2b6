from .gpt import GPT, GPTConfig
from .presets import PRESETS, Preset

__all__ = ["GPT", "GPTConfig", "PRESETS", "Preset"]
