"""scalekit: switch training and inference optimizations on a live model and measure them honestly."""

from . import launch  # callable: scalekit.launch(fn, *args, nprocs=N); also the package
from .autotune import autotune
from .comparison.applicable import applicable
from .comparison.compare import compare
from .errors import ConfigError, ToggleUnavailable
from .inference.config import GenerateConfig
from .inference.engine import generate
from .inference.results import GenerateResult, compare_generations
from .machine.hardware import detect
from .plan import estimate
from .predict import calibrate, plan_for  # also the package: scalekit.predict(model, gpus=...)
from .toggles import TOGGLES
from .training.batch_finder import find_batch_size
from .training.build import build
from .training.config import RunConfig
from .training.engine import run
from .training.results import RunResult

__version__ = "0.1.0"

__all__ = ["RunConfig", "RunResult", "run", "compare", "build", "detect", "TOGGLES", "ConfigError",
           "ToggleUnavailable", "Lab", "estimate", "find_batch_size", "launch", "autotune", "generate",
           "GenerateConfig", "GenerateResult", "compare_generations", "applicable", "predict", "calibrate",
           "plan_for"]


def load_ipython_extension(ipython):
    """`%load_ext scalekit`: adds the %%torchrun cell magic (IPython is imported only here)."""
    from .launch.magic import load_ipython_extension as load

    load(ipython)


def __getattr__(name):
    # the widget pulls in ipywidgets and plotly: import it only when asked for
    if name == "Lab":
        from .widgets import Lab

        return Lab
    raise AttributeError(f"module 'scalekit' has no attribute {name!r}")
