"""The ``pytest11`` entry point of boxmaker's pytest plugin, boxmaker.cassettes.pytest_plugin.

The plugin imports vcrpy. pytest-recording, when installed, asks pytest to rewrite the asserts
of ``vcr.matchers`` (``pytest.register_assert_rewrite``), which warns when the module was
imported already: whichever plugin pytest loads first (the order of installed distributions),
boxmaker's must not import vcrpy before that registration. So this module registers it first
(what pytest-recording asks for anyway), then loads the plugin through ``pytest_plugins``.
"""

from __future__ import annotations

import pytest

pytest.register_assert_rewrite("vcr.matchers")

pytest_plugins = ["boxmaker.cassettes.pytest_plugin"]
