"""Draft-config lint: no engine run. A draft whose config contradicts its weights or its
training is wrong before any engine touches it."""

from __future__ import annotations

import json

from harness.golden.bundle import Bundle, DraftSpec
from harness.judgement.assertions import fail
from harness.judgement.lint import lint_draft


def test_draft_config_is_consistent(bundle: Bundle, draft_name: str, spec: DraftSpec) -> None:
    target_cfg = json.loads((bundle.target_dir / "config.json").read_text())
    problems = lint_draft(bundle.draft_dir(draft_name), target_cfg, spec.convention, spec.boundaries)
    if problems:
        fail(f"draft {draft_name} config has {len(problems)} problem(s): "
             + "; ".join(str(p) for p in problems), draft=draft_name)
