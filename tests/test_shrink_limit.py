"""The per-profile shrink limit (issue #31 item 7: a failing run costs little more than a passing
one): every profile names one, a suite session applies the loaded profile's, and Hypothesis
honours it — a long shrink stops early and the failure is still raised with an example."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.internal.conjecture import engine as conjecture_engine

from harness.run import profiles


@pytest.fixture(autouse=True)
def _restore_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conjecture_engine, "MAX_SHRINKING_SECONDS",
                        conjecture_engine.MAX_SHRINKING_SECONDS)


def test_every_profile_has_a_shrink_limit() -> None:
    assert set(profiles.SHRINK_LIMIT_S) == set(profiles.PROFILES)


@pytest.mark.parametrize("profile", profiles.PROFILES)
def test_applying_a_profile_sets_hypothesis_limit(profile: str) -> None:
    limit = profiles.apply_shrink_limit(profile)
    assert limit == profiles.SHRINK_LIMIT_S[profile]
    assert conjecture_engine.MAX_SHRINKING_SECONDS == limit, (
        "Hypothesis' shrink limit was not set: its internal constant moved, so failing runs "
        "shrink for up to five minutes per check again")


def _shrink_calls(limit_s: int, monkeypatch: pytest.MonkeyPatch) -> tuple[int, list[int]]:
    """Calls of an always-failing property while it shrinks under `limit_s`, and the last example."""
    monkeypatch.setitem(profiles.SHRINK_LIMIT_S, "ci", limit_s)
    profiles.apply_shrink_limit("ci")
    calls: list[list[int]] = []

    @settings(derandomize=True, database=None, max_examples=50, deadline=None)
    @given(st.lists(st.integers(0, 1000), min_size=5))
    def prop(xs: list[int]) -> None:
        calls.append(list(xs))
        assert sum(xs) < 1500

    with pytest.raises(AssertionError):  # the failure is raised however early shrinking stops
        prop()
    return len(calls), calls[-1]


def test_the_limit_stops_a_long_shrink(monkeypatch: pytest.MonkeyPatch) -> None:
    unlimited, minimal = _shrink_calls(300, monkeypatch)
    stopped, partial = _shrink_calls(0, monkeypatch)
    assert sum(minimal) >= 1500 and sum(partial) >= 1500  # both still failing examples
    assert stopped < unlimited, (f"with a 0 s shrink limit Hypothesis made {stopped} calls, as many "
                                 f"as without one ({unlimited}): the limit is not honoured")


@pytest.mark.slow(reason="a pytest session in a subprocess loads the plugin and torch: ~10-30 s")
def test_a_session_applies_the_loaded_profiles_limit(tmp_path: Path) -> None:
    """Through the plugin, with the profile chosen the way a user chooses it (after our
    pytest_configure: Hypothesis' plugin loads --hypothesis-profile in its own). ci's limit is
    not Hypothesis' default, so a session that never applied it fails here."""
    profile, expected = "ci", profiles.SHRINK_LIMIT_S["ci"]
    assert expected != 300
    (tmp_path / "test_limit.py").write_text(
        "from hypothesis.internal.conjecture import engine\n"
        f"def test_limit():\n    assert engine.MAX_SHRINKING_SECONDS == {expected}\n")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          f"--hypothesis-profile={profile}", str(tmp_path / "test_limit.py")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
