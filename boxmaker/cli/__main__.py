"""``python -m boxmaker.cli``: the ``boxmaker`` command."""

from . import main

raise SystemExit(main())
