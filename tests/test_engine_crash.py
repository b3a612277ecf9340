"""An EngineCrash is plain data (the engine's message) and the suite diagnoses it where it
holds the draft's spec: the plugin turns a crash out of a check into a failure carrying the
crash diagnosis worded with the draft's own ids, and the reproducer."""

from __future__ import annotations

import json

import pytest

from harness.engines.base import EngineCrash

pytest_plugins = ["pytester"]

MATMUL = ("vLLM failed during capture: RuntimeError: mat1 and mat2 shapes cannot be multiplied "
          "(7x256 and 384x128)")
CHECKS = f'''
import pytest
from harness.engines.base import EngineCrash

@pytest.fixture
def loads_badly():
    raise EngineCrash({MATMUL!r})

def test_crashes(draft_name, bundle):
    raise EngineCrash({MATMUL!r})

def test_crashes_while_built(draft_name, loads_badly):
    pass

def test_other_error(draft_name):
    raise RuntimeError("not an engine crash")
'''


def test_engine_crash_holds_only_its_message() -> None:
    crash = EngineCrash(MATMUL)
    assert str(crash) == MATMUL and not {k for k in vars(crash) if not k.startswith("__")}


@pytest.mark.slow(reason="runs the plugin on a crashing engine in pytester (~8 s)")
def test_the_plugin_diagnoses_a_crash_with_the_drafts_ids(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_checks=CHECKS)
    out = pytester.path / "out"
    result = pytester.runpytest_subprocess("--draft", "embed-first", "--report-dir", str(out),
                                "-p", "no:cacheprovider")
    result.assert_outcomes(failed=2, errors=1)
    checks = {c["id"]: c for c in json.loads((out / "report.json").read_text())["checks"]}
    crashed = checks["test_checks.py::test_crashes[embed-first]"]
    assert [d["kind"] for d in crashed["diagnoses"]] == ["embedding_missing"]
    assert "ids [-1] match no layer" in crashed["diagnoses"][0]["message"]
    assert crashed["message"].startswith(MATMUL)
    assert "reproduce: eagle3-conformance run --engine reference --draft embed-first -k test_crashes" \
        in crashed["message"]
    built = checks["test_checks.py::test_crashes_while_built[embed-first]"]
    assert built["status"] == "error" and [d["kind"] for d in built["diagnoses"]] == ["embedding_missing"]
    other = checks["test_checks.py::test_other_error[embed-first]"]
    assert other["diagnoses"] == [] and "not an engine crash" in other["message"]
