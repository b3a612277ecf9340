"""The adapter template of docs/ADAPTERS.md is a real adapter: the suite's own machinery loads
it by dotted path and runs the capture, fc and config checks on the committed bundle; its
outside-the-package convention reaches the report and the diagnosis; the code the doc quotes
is the template's, verbatim."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from examples.template_adapter import TEMPLATE_CONVENTION, TemplateEngine
from harness.core.boundaries import CONVENTIONS, Convention
from harness.engines.base import EngineOptions
from harness.golden.bundle import load_bundle
from harness.golden.oracle import Oracle
from harness.golden.paths import default_bundle_path
from harness.judgement.assertions import CaptureContext, ConformanceFailure, assert_capture_matches

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "examples" / "template_adapter.py"
CHECKS = "draft_config or capture_pinned or fc_output or speculators-top-level"
# the layer-id checks on a speculators draft (ids at the top level of config.json): the
# template once read only eagle_config's ids and failed both with a KeyError
TOP_LEVEL_CHECKS = 2


@pytest.mark.slow(reason="runs the suite against the template in a subprocess (~15 s)")
def test_the_suite_runs_the_template_by_dotted_path(tmp_path: Path) -> None:
    out = tmp_path / "report"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "suites", "-q", "-p", "no:cacheprovider",
                           "--engine", "examples.template_adapter:TemplateEngine", "-k", CHECKS,
                           "--report-dir", str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, check=False, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    bundle = load_bundle(default_bundle_path(), verify_hashes=False)
    assert report["summary"]["verdict"] == "conformant"
    assert report["summary"]["passed"] == 3 * len(bundle.draft_names) + TOP_LEVEL_CHECKS
    assert report["engine"]["convention"] == TEMPLATE_CONVENTION.name not in CONVENTIONS
    assert {d: i["boundaries"] for d, i in report["engine"]["info"].items()} == {
        d: list(bundle.draft(d).boundaries) for d in bundle.draft_names}


class OffByOne(TemplateEngine):
    """The template with the rule of an engine that reads id k as boundary k."""

    convention = Convention(name="reads-id-as-boundary", description="b = id", offset=0)


def test_a_wrong_rule_fails_with_the_fix_in_the_adapters_own_convention() -> None:
    oracle = Oracle(load_bundle(default_bundle_path(), verify_hashes=False))
    draft = "specforge-default"
    engine = OffByOne(oracle.bundle.target_dir, oracle.bundle.draft_dir(draft), EngineOptions())
    try:
        prompts = oracle.pinned_prompts[:3]
        capture = engine.capture(prompts)
    finally:
        engine.close()
    spec = oracle.spec(draft)
    with pytest.raises(ConformanceFailure) as failed:
        assert_capture_matches(CaptureContext(training_boundaries=spec.boundaries, config_ids=spec.layer_ids,
                                              dtype="float32", engine_name="OffByOne", draft=draft,
                                              check="test_capture_pinned_prompts",
                                              engine_convention=OffByOne.convention),
                               features=capture.features, golden=[oracle.features(p) for p in prompts],
                               prompts=prompts)
    (diag,) = failed.value.diagnoses
    assert diag.kind == "offset" and diag.offset == -1
    assert diag.suggested_layer_ids == list(spec.boundaries)  # b = id: the ids are the boundaries
    assert "for reads-id-as-boundary" in diag.message


def test_the_doc_quotes_the_template_verbatim() -> None:
    doc = (ROOT / "docs" / "ADAPTERS.md").read_text()
    source = TEMPLATE.read_text()
    quoted = re.findall(r"```python\n# examples/template_adapter.py\n(.*?)```", doc, re.S)
    assert len(quoted) >= 3, "ADAPTERS.md quotes the template in blocks headed '# examples/template_adapter.py'"
    for block in quoted:
        assert block in source, f"ADAPTERS.md quotes code the template does not have:\n{block}"


def test_a_dotted_path_is_found_in_the_current_folder(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """ADAPTERS.md's `eagle3-conformance run --engine examples.template_adapter:TemplateEngine`
    runs the console script, which (unlike `python -m`) does not put the current folder on
    sys.path: the registry must look there, or a fresh clone answers "no module 'examples'".
    A vendor's own package in a fresh folder, with that folder off sys.path, is found."""
    from harness.run.registry import resolve_engine

    package = tmp_path / "vendor_adapters"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "engine.py").write_text("from examples.template_adapter import TemplateEngine\n\n"
                                       "class VendorEngine(TemplateEngine):\n    name = 'vendor'\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "vendor_adapters", raising=False)
    monkeypatch.delitem(sys.modules, "vendor_adapters.engine", raising=False)
    cls = resolve_engine("vendor_adapters.engine:VendorEngine")
    assert cls.__name__ == "VendorEngine" and issubclass(cls, TemplateEngine)


def test_the_reproducer_repeats_the_dotted_path_and_the_convention_prints_by_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure's reproducer must rerun the engine it failed on: for an adapter that is the
    --engine value given (`examples.template_adapter:TemplateEngine`), not its `name`
    ("template", which --engine refuses); an adapter's own convention prints as its name."""
    from harness.judgement import verdict

    monkeypatch.setattr(verdict, "_RUN_ENGINE", {})
    assert "--engine template " in verdict.reproducer("template", "single-aux", check="c")
    verdict.set_run_engine("examples.template_adapter:TemplateEngine")
    line = verdict.reproducer(TemplateEngine.name, "single-aux", check="c")
    assert "--engine examples.template_adapter:TemplateEngine --draft single-aux -k c" in line, line
    assert f"{TEMPLATE_CONVENTION}" == "template-engine"


# what the template may import of the package: the public API, and the two modules that stand
# in for the vendor's engine (marked "YOUR ENGINE" in the template)
STAND_IN_ENGINE = {"harness.engines.speculative", "harness.models.draft"}


def test_the_template_uses_only_the_public_adapter_api() -> None:
    """A vendor's adapter built from the template must not depend on the package's inside
    (which the house issue rearranges): of the package it imports harness.adapter only,
    besides the stand-in engine it tells the vendor to replace."""
    import ast

    used = {node.module for node in ast.walk(ast.parse(TEMPLATE.read_text()))
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("harness")}
    assert used - STAND_IN_ENGINE == {"harness.adapter"}, sorted(used)


@pytest.mark.parametrize(("config", "ids"), [
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]}}, [1, 3, 4]),
    ({"eagle_aux_hidden_state_layer_ids": [2, 4]}, [2, 4]),
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [-1]},
      "eagle_aux_hidden_state_layer_ids": [5]}, [-1]),
    ({"eagle_config": {}}, None),
    ({}, None),
], ids=["specforge-nested", "speculators-top-level", "both-nested-first", "empty-eagle-config", "none"])
def test_config_layer_ids_reads_both_layouts(tmp_path: Path, config: dict, ids: list[int] | None) -> None:
    from harness.adapter import config_layer_ids

    (tmp_path / "config.json").write_text(json.dumps(config))
    assert config_layer_ids(tmp_path) == ids
