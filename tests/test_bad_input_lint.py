"""The draft lint on malformed drafts: every problem a one-line LintProblem, never a raw
exception (which would become the check's message), never a silent truncation."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.lint import lint_draft

DRAFT = "draft-specforge-default"


def _lint(bundle: Path, tmp: Path, change: Any) -> list[str]:
    folder = tmp / "draft"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(bundle / DRAFT, folder)
    cfg = json.loads((folder / "config.json").read_text())
    change(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))
    target = json.loads((bundle / "target" / "config.json").read_text())
    return [str(p) for p in lint_draft(folder, target, "specforge", (2, 4, 5))]


def _set_ids(value: Any) -> Any:
    return lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=value)


@pytest.mark.parametrize("change, needle", [
    (_set_ids([1.5, 3, 4]), "holds 1.5, not an integer"),
    (_set_ids([]), "is empty"),
    (_set_ids("one"), "is 'one', must be a list"),
    (_set_ids([None, 3, 4]), "holds None"),
    (lambda c: c.update(hidden_size=-4), "hidden_size: is -4"),
    (lambda c: c.update(vocab_size=None), "vocab_size: missing"),
    (lambda c: c.update(rms_norm_eps="tiny"), "rms_norm_eps: is 'tiny'"),
    (lambda c: c.update(architectures="LlamaForCausalLMEagle3"), "architectures: is 'LlamaForCausalLMEagle3'"),
    (lambda c: c["eagle_config"].update(use_aux_hidden_state="yes"), "use_aux_hidden_state: is 'yes'"),
])
def test_malformed_draft_config_is_one_line(change: Any, needle: str, smoke_bundle: Path,
                                            tmp_path: Path) -> None:
    problems = _lint(smoke_bundle, tmp_path, change)
    assert any(needle in p for p in problems), problems
    assert all("\n" not in p and "Traceback" not in p for p in problems)


def test_the_control_draft_lints_clean(smoke_bundle: Path, tmp_path: Path) -> None:
    assert _lint(smoke_bundle, tmp_path, lambda c: None) == []


JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 9) | st.floats(allow_nan=True)
                    | st.text(max_size=3), lambda inner: st.lists(inner, max_size=3), max_leaves=5)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=JSON, hidden=JSON)
def test_lint_never_raises(ids: Any, hidden: Any, smoke_bundle: Path, tmp_path: Path) -> None:
    """Any JSON in the two fields the engines read first: problems, never an exception."""
    def change(c: dict) -> None:
        c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = ids
        c["hidden_size"] = hidden
    problems = _lint(smoke_bundle, tmp_path, change)
    assert all(isinstance(p, str) and "\n" not in p for p in problems)
