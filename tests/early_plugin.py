"""Loaded by pytest before its other plugins (pyproject's addopts: -p tests.early_plugin), in every process pytest
starts, xdist's workers included.

nbval's plugin imports nbformat, whose jsonschema builds rfc3987_syntax's IRI grammar at import: 1.4 s of every
pytest process's start, for a format checker nothing here uses (no notebook validates an IRI, and jsonschema
without that optional package simply has no "iri" checker).  The notebook kernels get the same line from an
IPython startup file (tests/conftest.py)."""

import sys

sys.modules.setdefault("rfc3987_syntax", None)
