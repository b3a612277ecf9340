"""Repository-level pytest setup. The suite's options, fixtures and report come from the
plugin (`harness.run.plugin`, entry point `eagle3_conformance`); this file only makes a source
checkout work before `pip install -e .` has registered that entry point."""

from __future__ import annotations

import pytest

import harness.run.plugin
import harness.run.profiles  # noqa: F401 - the dev/ci/nightly Hypothesis profiles exist from here on


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    # Registered here only when the entry point did not load it: registering it twice would
    # add every option twice. Registration replays pytest_addoption for the plugin.
    if not pluginmanager.is_registered(harness.run.plugin):
        pluginmanager.register(harness.run.plugin, "eagle3_conformance")
