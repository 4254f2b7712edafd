"""Sphinx configuration of boxmaker's docs site.

Build: ``python -m sphinx -W --keep-going -b html docs docs/_build/html`` (warnings are errors).
Nothing is fetched at build time and the built site loads nothing from another host.
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS / "_ext"))

project = "boxmaker"
author = "the boxmaker authors"
copyright = "the boxmaker authors"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "myst_nb",
    "sphinxarg.ext",
    "boxmaker_docs",
]

exclude_patterns = ["_build", "notebooks/.ipynb_checkpoints", "notebooks/__pycache__"]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}

# Google-style sections (Args, Returns, Raises) as napoleon reads them
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True

# the notebooks are executed by tests/test_notebooks.py; here they are rendered as stored
nb_execution_mode = "off"
nb_ipywidgets_js = {}  # no widget manager from a CDN
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

html_theme = "furo"
html_title = "boxmaker"
html_static_path: list[str] = []
html_show_sourcelink = False
html_copy_source = False
napoleon_use_ivar = True
