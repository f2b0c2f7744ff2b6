"""`python -m scalekit.cli`: the console script."""

import sys

from .main import program

sys.exit(program())
