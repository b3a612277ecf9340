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
