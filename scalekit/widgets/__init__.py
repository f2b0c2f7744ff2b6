"""Jupyter widgets.  Imports ipywidgets and plotly: `import scalekit` alone never loads this package."""

from .lab import Lab

__all__ = ["Lab"]
