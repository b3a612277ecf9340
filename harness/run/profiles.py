"""Hypothesis profiles for the suite, registered on import.

Engine calls take hundreds of milliseconds, so every profile drops the per-example deadline
(a slow engine is not a nonconformant one) and bounds the example count: `dev` for a quick
local loop, `ci` reproducible (derandomized, failing examples printed as blobs to replay),
`nightly` to search harder. The default is `ci` under CI, else `dev`; HYPOTHESIS_PROFILE and
then `--hypothesis-profile` override it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from hypothesis import HealthCheck, settings
from hypothesis.internal.conjecture import engine as _conjecture_engine

PROFILES = ("dev", "ci", "nightly")
_SLOW_IS_FINE = [HealthCheck.too_slow]

settings.register_profile("dev", max_examples=5, deadline=None,
                          suppress_health_check=_SLOW_IS_FINE)
settings.register_profile("ci", max_examples=10, derandomize=True, deadline=None, print_blob=True,
                          database=None, suppress_health_check=_SLOW_IS_FINE)
settings.register_profile("nightly", max_examples=200, deadline=None, print_blob=True,
                          suppress_health_check=_SLOW_IS_FINE)


# The layer-id check serves a new draft (a new engine: ~15 s for vLLM on a CPU) for most
# examples, so it draws fewer than the other checks; its probes and fixes run in every profile.
LAYER_ID_EXAMPLES = {"dev": 4, "ci": 5, "nightly": 100}
# Seconds of engine start-up one drawn layer-id property may spend on new configs (examples and
# shrink steps); past it, examples naming an unserved config are rejected, so generation and
# shrinking continue on the configs already up. A reference engine starts in well under a
# second and serves dozens; a vLLM worker takes ~15 s, so ci serves the first config per layout.
LAYER_ID_STARTUP_BUDGET_S = {"dev": 10.0, "ci": 10.0, "nightly": None}


# Seconds Hypothesis may spend shrinking one failing check. Its own limit is five minutes per
# failure (`MAX_SHRINKING_SECONDS`, which its source keeps monkeypatchable for exactly this), so a
# run with a dozen failing checks could spend an hour shrinking while a passing run takes ~6 min:
# issue #31 measured a failing ci run at 18 min against 3 min 50 s. Measured since, a failing
# check's whole extra time is ~1-7 s (zoo:ids_plus_one, 28 failing checks, 42 s in all, a
# ci run of 357 s against the passing 382 s): 30 s is several times what a shrink needs here and
# caps one pathological shrink at under a tenth of a passing ci run. Where it stops, Hypothesis
# reports the smallest failing example found so far (its warning says "five minutes" whatever
# the limit). nightly keeps Hypothesis' own limit: it is the run that searches hardest.
SHRINK_LIMIT_S = {"dev": 30, "ci": 30, "nightly": 300}


def apply_shrink_limit(profile: str | None = None) -> int:
    """Set Hypothesis' shrink limit to SHRINK_LIMIT_S of `profile` (default: the loaded one; a
    profile registered elsewhere gets ci's) and return it."""
    name = profile or settings.get_current_profile_name()
    limit = SHRINK_LIMIT_S.get(name, SHRINK_LIMIT_S["ci"])
    _conjecture_engine.MAX_SHRINKING_SECONDS = limit
    return limit


def layer_id_examples(profile: str | None = None) -> int:
    """max_examples of each drawn layer-id property under `profile` (default: the loaded one)."""
    return LAYER_ID_EXAMPLES.get(profile or settings.get_current_profile_name(), LAYER_ID_EXAMPLES["ci"])


def layer_id_startup_budget_s(profile: str | None = None) -> float | None:
    """LAYER_ID_STARTUP_BUDGET_S of `profile` (default: the loaded one); None: no limit."""
    name = profile or settings.get_current_profile_name()
    return LAYER_ID_STARTUP_BUDGET_S.get(name, LAYER_ID_STARTUP_BUDGET_S["ci"])


def _truthy(value: str | None) -> bool:
    return bool(value) and value.strip().lower() not in ("0", "false", "no", "off")


def default_profile(environ: Mapping[str, str] = os.environ) -> str:
    """HYPOTHESIS_PROFILE if it names a profile, else `ci` when CI is set, else `dev`."""
    named = environ.get("HYPOTHESIS_PROFILE", "").strip()
    if named:
        return named
    return "ci" if _truthy(environ.get("CI")) else "dev"


def load_default_profile(environ: Mapping[str, str] = os.environ) -> str:
    name = default_profile(environ)
    settings.load_profile(name)
    return name
