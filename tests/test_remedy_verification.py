"""Remedies verified by re-serving (issue #31, item 2). Where a diagnosis' remedy is a change of
the draft's config, `suites/test_layer_ids.py::test_suggested_fix_verified` writes a remedied
copy of the bundle draft (its ids, their layout, their order with fc's input blocks permuted),
serves it through the engine under test and judges it: the report says "verified" only where
the copy was then served as trained, "unverified: <why>" where it could not be re-served, where
the remedy is an engine change, or where the copy still fails (and how). Each case runs the
suite on a real zoo engine (or the adapter template with its hook moved) in a subprocess and
reads report.json and report.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
HOOK_ON_OUTPUT = "test_remedy_addressee:TemplateHookOnLayerOutput"


def _suite(tmp_path: Path, engine: str, draft: str, checks: str) -> tuple[int, dict[str, Any], str]:
    """(exit code, report.json, report.md) of the suite's `checks` on one draft."""
    out = tmp_path / "report"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "suites/test_layer_ids.py",
         "suites/test_aux_capture.py", "-k", checks, "--engine", engine, "--draft", draft,
         "--report-dir", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
        check=False)
    assert (out / "report.json").exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return (proc.returncode, json.loads((out / "report.json").read_text()),
            (out / "report.md").read_text())


def _fix(report: dict[str, Any], draft: str) -> dict[str, Any]:
    fixes = {f["draft"]: f for f in report["observed_convention"]["fixes"]}
    assert draft in fixes, f"no remedy recorded for {draft}: {report['observed_convention']['fixes']}"
    return fixes[draft]


def _check(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in report["checks"] if c["id"].split("::")[-1] == name)


@pytest.mark.slow(reason="runs the layer-id and capture checks on a zoo engine (~25 s)")
@pytest.mark.parametrize(("engine", "draft", "ids", "order"), [
    # slots in descending order: the ids listed the way the engine fills its slots, fc's input
    # blocks permuted to match (the engine declares no convention, so no id list was suggested)
    ("zoo:slots_descending", "specforge-default", [4, 3, 1], [2, 1, 0]),
    # every id read one boundary late, no declared convention: the ids one earlier, in the
    # convention the engine is told
    ("zoo:ids_plus_one", "specforge-default", [0, 2, 3], None),
])
def test_a_config_remedy_is_verified_by_reserving_a_remedied_copy(
        tmp_path: Path, engine: str, draft: str, ids: list[int], order: list[int] | None) -> None:
    code, report, md = _suite(tmp_path, engine, draft,
                              "test_suggested_fix_verified or test_capture_pinned_prompts")
    fix = _fix(report, draft)
    assert fix["remedy"] == "verified", fix
    assert fix["result"].startswith("verified: re-served with"), fix["result"]
    assert fix["ids"] == ids and fix["slot_order"] == order, fix
    assert _check(report, f"test_suggested_fix_verified[{draft}]")["status"] == "passed"
    # the capture check still fails (the engine is wrong as served); its diagnosis now says the
    # remedy was verified, in report.json and report.md
    capture = _check(report, f"test_capture_pinned_prompts[{draft}]")
    assert capture["status"] == "failed" and code == 1
    (diag,) = capture["diagnoses"]
    assert diag["remedy"] == {"status": "verified", "result": fix["result"]}, diag.get("remedy")
    assert f"  - remedy {fix['result']}" in md


@pytest.mark.slow(reason="runs the layer-id and capture checks on an engine (~25 s)")
@pytest.mark.parametrize(("engine", "why"), [
    # the config's ids already mean training's boundaries in the convention the engine declares:
    # the hook is wrong, and the literal ids are re-served to show what the engine does
    (HOOK_ON_OUTPUT, "the remedy is an engine change (for the engine vendor)"),
    # a capture fault no id list touches
    ("zoo:residual_missing", "the remedy is an engine change (residual_missing, for the engine vendor)"),
])
def test_an_engine_side_fault_is_never_verified(tmp_path: Path, engine: str, why: str) -> None:
    draft = "specforge-default"
    _code, report, md = _suite(tmp_path, engine, draft,
                               "test_suggested_fix_verified or test_capture_pinned_prompts")
    fix = _fix(report, draft)
    assert fix["remedy"] == "unverified" and fix["result"].startswith(f"unverified: {why}"), fix
    assert fix["addressee"] == "engine vendor", fix
    (diag,) = _check(report, f"test_capture_pinned_prompts[{draft}]")["diagnoses"]
    assert diag["addressee"] == "engine vendor" and diag["remedy"]["status"] == "unverified", diag
    assert "remedy verified" not in md and "  - remedy unverified: the remedy is an engine change" in md
    if engine == HOOK_ON_OUTPUT:  # the literal ids, re-served, fill the slots one boundary late
        assert "fill the slots with [3, 5, 6]" in fix["result"], fix["result"]


@pytest.mark.slow(reason="runs the layer-id check on a zoo engine (~25 s)")
def test_a_remedy_whose_reserved_copy_still_fails_says_how(tmp_path: Path) -> None:
    """zoo:config_ids_ignored captures its defaults whatever key the ids sit under: the remedy
    (the ids where the engine reads them) is re-served in both layouts and fails in both."""
    draft = "final-aux"
    code, report, _md = _suite(tmp_path, "zoo:config_ids_ignored", draft, "test_suggested_fix_verified")
    fix = _fix(report, draft)
    assert fix["remedy"] == "unverified", fix
    assert fix["result"].startswith("unverified: re-served with ids [2, 4, 8] (speculators-top-level), "
                                    "the slots still hold [2, 4, 5], the remedy needs [2, 4, 8]"), fix["result"]
    check = _check(report, f"test_suggested_fix_verified[{draft}]")
    assert check["status"] == "failed" and code == 1
