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

from harness.core.boundaries import CONVENTIONS
from harness.judgement.lint import lint_draft

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


# -- the conventions: ids valid under a trainer's convention are not errors ---------------------

N = 8  # the committed target's layers


def _invalid_ids(conv) -> list[list[int]]:
    """Id lists this convention cannot read: past the last boundary, a negative id it has no
    embedding meaning for, and the boundaries it cannot capture named by its own rule."""
    from harness.core.boundaries import Convention

    assert isinstance(conv, Convention)
    bad = [[1, 3, N + 1], [-2, 3, 5], [3, 3, 5]]
    if not conv.capture_embedding:
        bad.append([-conv.offset if conv.offset else 0, 3, 5])
    if not conv.capture_final:
        bad.append([1, 3, N - conv.offset])
    return bad


@pytest.mark.parametrize("name", sorted(CONVENTIONS))
def test_every_convention_valid_and_invalid_ids(name: str) -> None:
    """Per convention of harness/core/boundaries.py: its own default ids (and the same ids in
    reverse order: sorted or not, a list a trainer writes is still valid) are read by it and
    named in the readings with the boundaries they mean; ids it cannot read are a problem
    under it, and listed as not valid under it with why."""
    from harness.core.boundaries import ids_to_boundaries
    from harness.judgement.lint import convention_readings, ids_problem

    conv = CONVENTIONS[name]
    valid = list(conv.default_ids(N))
    for ids in (valid, valid[::-1]):
        assert ids_problem(ids, name, N, None) is None, ids
        assert ids_problem(ids, None, N, None) is None, ids
        means = list(ids_to_boundaries(ids, name, N))
        lines = convention_readings(ids, N)
        assert any(f"mean boundaries {means}" in line
                   and name in [c.split(" ")[0] for c in line.split(" under ")[1].split(", ")]
                   for line in lines), lines
    for ids in _invalid_ids(conv):
        assert ids_problem(ids, name, N, None), (name, ids)
        not_valid = [line for line in convention_readings(ids, N) if "are not valid under" in line]
        assert not_valid and f"{name} (" in not_valid[0], (name, ids, not_valid)


def test_ids_no_convention_reads_are_an_error_naming_the_fix() -> None:
    from harness.judgement.lint import ids_problem

    problem = ids_problem([99, 3, 5], None, N, None)
    assert problem and "valid under no known convention" in problem and "trainer's convention" in problem


def _embed_first(tmp: Path, ids: list[int]) -> Path:
    from harness.golden.paths import default_bundle_path
    from harness.tools.doctor import NESTED, with_ids

    return with_ids(default_bundle_path() / "draft-embed-first", ids, NESTED, tmp)


def test_a_correct_minus_one_draft_lints_clean(tmp_path: Path) -> None:
    """The motivating draft written correctly, ids [-1, 3, 5] ("-1 = embedding"): no error (it
    was told "use ids >= 0"), and the readings say what it means there and where it is invalid."""
    from harness.golden.paths import default_bundle_path
    from harness.judgement.lint import convention_readings

    target = json.loads((default_bundle_path() / "target" / "config.json").read_text())
    assert lint_draft(_embed_first(tmp_path, [-1, 3, 5]), target, None) == []
    lines = convention_readings([-1, 3, 5], N)
    assert any("mean boundaries [0, 4, 6]" in line and "embedding-minus-one (trainer)" in line
               for line in lines), lines
    assert any("not valid under" in line and "specforge (trainer)" in line for line in lines), lines
    # under a named convention that cannot read it, it is still an error (the suite's check)
    assert any("rejected" in str(p) for p in lint_draft(_embed_first(tmp_path, [-1, 3, 5]), target, "specforge"))


def test_ids_valid_nowhere_fail_lint_without_a_convention(tmp_path: Path) -> None:
    from harness.golden.paths import default_bundle_path

    target = json.loads((default_bundle_path() / "target" / "config.json").read_text())
    problems = [str(p) for p in lint_draft(_embed_first(tmp_path, [-3, 3, 5]), target, None)]
    assert len(problems) == 1 and "valid under no known convention" in problems[0], problems
