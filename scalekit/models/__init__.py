from .gpt import GPT, GPTConfig
from .presets import PRESETS, Preset
from .pretrained import PRETRAINED_NAMES, load_pretrained, pretrained_info

__all__ = ["GPT", "GPTConfig", "PRESETS", "PRETRAINED_NAMES", "Preset", "load_pretrained", "pretrained_info"]
