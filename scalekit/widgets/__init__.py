"""Jupyter widgets.  Imports ipywidgets and plotly: `import scalekit` alone never loads this package."""

from .at_scale import AtScale
from .lab import Lab

__all__ = ["Lab", "AtScale"]
