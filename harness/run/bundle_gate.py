"""Whether a loaded bundle may certify anything: the committed bundle must be at its pinned
digest, and every draft must lint clean. Neither is a finding about the engine, so both are
refused as bad input (exit 2) before any check runs: a draft failing lint by every command
that loads a bundle, the pin by the certifying ones, `run` and `selftest` (`golden verify
--pinned` checks it on request; `golden diff` must still show what a tamperer changed).

Why the pin is checked on every run of the committed bundle: its manifest pins every file's
sha256, so a tamperer who edits a file and recomputes the hashes leaves a self-consistent
bundle that `load_bundle` accepts; only the manifest's own digest, pinned in the code
(`harness.golden.integrity.PINNED_MANIFESTS`), tells. A bundle the user built elsewhere has
no pin: it is certified against, but the report and the verdict line call it "unpinned".
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from harness.golden.bundle import MANIFEST, Bundle
from harness.golden.integrity import PINNED_MANIFESTS, pinned_problem


def is_pinned(bundle: Bundle) -> bool:
    """The bundle's manifest is the one pinned under its name."""
    want = PINNED_MANIFESTS.get(bundle.name)
    return want is not None and hashlib.sha256((bundle.path / MANIFEST).read_bytes()).hexdigest() == want


def is_committed(bundle: Bundle) -> bool:
    """The bundle is a committed golden/<name> of this checkout (by location, links resolved):
    the default one, or another pinned one beside it (golden/tiny-qwen3moe, issue #37), whose
    pin is then checked on every run like the default's."""
    from harness.golden.paths import committed_bundle_path, default_bundle_path

    try:
        here = bundle.path.resolve()
        return here == default_bundle_path().resolve() or (
            bundle.name in PINNED_MANIFESTS and here == committed_bundle_path(bundle.name).resolve())
    except (OSError, RuntimeError):  # a loop: load_bundle has refused it already
        return False


def committed_pin_problem(bundle: Bundle) -> str | None:
    """Why the committed bundle is not the pinned one (edited, or rebuilt without updating
    the pin), or None; None for any other bundle (it is reported as unpinned instead)."""
    if not is_committed(bundle):
        return None
    problem = pinned_problem(bundle.name, bundle.path / MANIFEST)
    return None if problem is None else (
        f"the committed bundle fails its pin: {problem} (rebuilt on purpose: pin its new digest "
        f"in harness/golden/pins.py)")


def bundle_lint_problem(bundle: Bundle) -> str | None:
    """The first draft-lint problem of any draft of the bundle, as one line with the fix."""
    from harness.judgement.lint import lint_draft

    try:
        target_cfg: Any = json.loads((bundle.target_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return f"bundle {bundle.path}: the target config cannot be read ({e}); restore or rebuild"
    for name, spec in bundle.drafts.items():
        problems = lint_draft(bundle.draft_dir(name), target_cfg, spec.convention, spec.boundaries)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            return (f"bundle {bundle.path}: draft {name} fails the draft lint: {problems[0]}{more}; "
                    f"a bundle with a broken draft certifies nothing — fix the draft or rebuild "
                    f"the bundle")
    return None
