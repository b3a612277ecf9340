"""The canary (suites/test_canary.py) judges wiring from acceptance counters alone, so it must
pass the reference engine on every bundle draft and fail every zoo mutant that changes which
states the draft sees (or how fc reads them) on a draft it touches, through
`Generation.acceptance` and nothing else. Also: the wrong-wiring table behind the canary's
line is what the reference runtime measures (one row per draft recomputed here)."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest

from harness.engines.base import EngineOptions
from harness.engines.reference import ReferenceEngine
from harness.engines.zoo import MUTANTS
from harness.golden.bundle import BundleError, load_bundle
from harness.golden.paths import default_bundle_path
from harness.golden.wirings import (
    SERVED,
    choose_canary,
    mean_acceptance_length,
    per_prompt_acceptance,
    wirings,
)
from harness.judgement.assertions import ConformanceFailure, assert_canary_accepts, canary_line
from harness.models.draft import Eagle3Draft
from harness.models.target import load_target

# the hooks through which a mutant changes what the draft is fed: the slots' boundaries, the
# state in a slot, their concatenation, fc (hangs are the timeout layer's, not the canary's)
STATE_HOOKS = ("capture_boundaries", "take_state", "combine", "project")
STATE_MUTANTS = sorted(k for k, c in MUTANTS.items()
                       if c.hook in STATE_HOOKS and not c.caught_by and k != "capture_hangs")


@cache
def _bundle() -> Any:
    try:
        b = load_bundle(default_bundle_path(), verify_hashes=False)
    except BundleError as e:
        pytest.skip(f"committed bundle unavailable: {e}")
    if not all("canary" in d for d in b.manifest["drafts"].values()):
        pytest.fail("the committed bundle records no canary; rebuild it with `golden build`")
    return b


def _canary_prompts(draft: str) -> list[list[int]]:
    held = _bundle().tensors["heldout.ids"].tolist()
    return [held[i] for i in _bundle().manifest["drafts"][draft]["canary"]["prompts"]]


@cache
def _served(cls: type[ReferenceEngine], draft: str) -> tuple[float | None, Any, Any]:
    """(canary acceptance length or None if the engine crashed, capture features, fc out)."""
    b = _bundle()
    spec = b.draft(draft)
    engine = cls(b.target_dir, b.draft_dir(draft),
                 EngineOptions(num_draft_tokens=spec.num_draft_tokens, training_convention=spec.convention))
    try:
        # each prompt alone, as the canary serves them: a bug that needs a batch is the batch
        # checks' to see (the reference runtime generates prompt by prompt)
        caps = [engine.capture([p]) for p in _canary_prompts(draft)[:2]]
        gen = engine.generate(_canary_prompts(draft), int(b.manifest["heldout"]["max_new_tokens"]), True)
    except RuntimeError:
        return None, None, None  # crashes where the real engine crashes: other checks report it
    finally:
        engine.close()
    assert gen.acceptance is not None
    return (gen.acceptance.mean_acceptance_length, [f for c in caps for f in c.features],
            [o for c in caps for o in c.fc_out])


def _sees_other_states(key: str, draft: str) -> bool:
    _, ref_f, ref_fc = _served(ReferenceEngine, draft)
    _, f, fc = _served(MUTANTS[key], draft)
    # beyond bf16 rounding (unit 2^-8): rounding the states is no other state
    return not all(x.shape == y.shape and float((x - y).norm() / y.norm().clamp_min(1e-12)) < 1e-2
                   for x, y in zip(f + fc, ref_f + ref_fc, strict=True))


def _judge(measured: float, draft: str) -> bool:
    try:
        assert_canary_accepts(measured, _bundle().manifest["drafts"][draft]["canary"],
                              engine_name="test", draft=draft, prompts=_canary_prompts(draft))
    except ConformanceFailure:
        return False
    return True


@pytest.mark.parametrize("draft", ["specforge-default", "embed-first", "single-aux", "final-aux"])
def test_reference_passes_the_canary(draft: str) -> None:
    measured, _, _ = _served(ReferenceEngine, draft)
    assert measured is not None and _judge(measured, draft), \
        (draft, measured, _bundle().manifest["drafts"][draft]["canary"])


@pytest.mark.parametrize("key", STATE_MUTANTS)
def test_state_mutant_fails_the_canary(key: str) -> None:
    """Every mutant that changes what a draft sees fails the canary on a draft it touches, so a
    suite run (every bundle draft) catches it through counters alone. Not on every draft: the
    line sits half-way between served and the best wrong wiring, and a subtle bug on one draft
    costs less than that (aux_residual_only on embed-first: 4.255 against 4.312 served)."""
    touched = [d for d in _bundle().draft_names
               if _served(MUTANTS[key], d)[0] is not None and _sees_other_states(key, d)]
    crashed = [d for d in _bundle().draft_names if _served(MUTANTS[key], d)[0] is None]
    if not touched and not crashed:
        pytest.skip(f"{key} hands the draft the same states as the reference when each prompt is "
                    f"served alone (beyond bf16 rounding): a batch or precision bug, the batch and "
                    f"capture checks' to catch, not the canary's")
    passed = {d: round(_served(MUTANTS[key], d)[0], 3) for d in touched
              if _judge(_served(MUTANTS[key], d)[0], d)}
    print(f"{key}: touches {touched}, crashes on {crashed}, passes the canary on {passed}")
    assert crashed or set(passed) != set(touched), f"{key} passes the canary on every draft it touches: {passed} (lines: " + ", ".join(
        f"{d} {_bundle().manifest['drafts'][d]['canary']['threshold']}" for d in passed) + ")"


@pytest.mark.slow(reason="serves every wiring of a draft with the reference runtime (~6 s a draft)")
@pytest.mark.parametrize("draft", ["specforge-default", "embed-first", "single-aux", "final-aux"])
def test_wiring_table_is_what_the_reference_runtime_measures(draft: str) -> None:
    """The served row and the first wrong row of the manifest, recomputed (the builder's
    numbers are measurements, not typed in)."""
    b = _bundle()
    rows = b.manifest["drafts"][draft]["wirings"]
    target = load_target(b.target_dir)
    model = Eagle3Draft.load(b.draft_dir(draft))
    held = b.tensors["heldout.ids"].tolist()
    n = int(b.manifest["heldout"]["max_new_tokens"])
    ws = wirings(b.draft(draft).boundaries, b.num_layers, model.cfg.num_aux * model.cfg.target_hidden_size,
                 model.cfg.hidden_size)
    assert [w.name for w in ws] == list(rows)
    for w in ws[:2]:
        got = mean_acceptance_length(per_prompt_acceptance(target, model, w, held, 4, n))
        assert round(got, 6) == rows[w.name]["acceptance_length"], (w.name, got, rows[w.name])


def test_wirings_list_only_what_changes_something() -> None:
    names = lambda t, fc_in: [w.name for w in wirings(t, 8, fc_in, 128)]  # noqa: E731
    assert names((2, 4, 5), 384) == [SERVED, "slots_minus_one", "slots_plus_one", "slots_permuted"]
    assert names((0, 4, 6), 384) == [SERVED, "slots_minus_one", "slots_plus_one", "embedding_dropped",
                                     "engine_defaults", "slots_permuted"]
    assert names((4,), 128) == [SERVED, "slots_minus_one", "slots_plus_one", "fc_skipped"]
    assert names((2, 4, 8), 384) == [SERVED, "slots_minus_one", "slots_plus_one", "engine_defaults",
                                     "slots_permuted", "final_normed", "final_missing"]
    # a shift clamped back onto training is no wrong wiring
    assert "slots_minus_one" not in names((0,), 128)


def test_canary_picks_the_widest_gaps_and_draws_the_line_half_way() -> None:
    traces = {SERVED: [[4, 4], [4, 0], [2, 2], [4, 4]],
              "a": [[0, 0], [4, 0], [2, 2], [1, 1]],
              "b": [[1, 1], [0, 0], [0, 0], [2, 2]]}
    c = choose_canary(traces, 2, 0.5)
    assert c.prompts == (0, 3)  # margins 3 and 2; prompts 1 and 2 have none
    assert c.served == 5.0 and c.best_wrong == 2.5 and c.best_wrong_wiring == "b"
    assert c.threshold == pytest.approx(3.75)


def test_canary_line_in_reduced_precision_follows_the_same_dtype_reference() -> None:
    """fp32: the bundle's line. bf16: the served side is the lower of fp32's and the reference's
    own in that dtype, the line half-way from the best wrong wiring to it; no line where that
    reference is no better than the wrong wiring (the check then skips, saying so)."""
    c = {"served": 4.0, "best_wrong": 3.0, "threshold": 3.5, "best_wrong_wiring": "x"}
    assert canary_line(c) == 3.5
    assert canary_line(c, 3.6) == pytest.approx(3.3)
    assert canary_line(c, 4.2) == pytest.approx(3.5)  # never above fp32's own line
    assert canary_line(c, 2.9) is None and canary_line(c, 3.0) is None
    with pytest.raises(ConformanceFailure, match="reference engine itself serves 3.600"):
        assert_canary_accepts(3.2, c, engine_name="e", draft="d", prompts=[[1]], same_dtype=3.6)


@pytest.mark.slow(reason="runs the canary check on the smoke bundle in a subprocess (~30 s)")
def test_an_fp32_canary_without_a_line_skips_with_its_reason(smoke_bundle, tmp_path) -> None:
    """Where the bundle's own canary, served as trained, is no better than its best wrong wiring
    (the untrained smoke bundle), the fp32 check skips and says so; its message formatted the
    same-dtype reference's value, which fp32 does not have, and raised TypeError instead."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    manifest = json.loads((smoke_bundle / "manifest.json").read_text())
    lineless = [d for d, spec in manifest["drafts"].items()
                if spec.get("canary") is not None and canary_line(spec["canary"]) is None]
    if not lineless:
        pytest.skip("every smoke-bundle draft's canary has a line in fp32: nothing to show here")
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "suites/test_canary.py",
         "--engine", "reference", "--bundle", str(smoke_bundle), "--report-dir", str(out)],
        cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True,
        timeout=600, check=False)
    assert "TypeError" not in proc.stdout + proc.stderr, proc.stdout[-3000:]
    report = json.loads((out / "report.json").read_text())
    skipped = [c for c in report["checks"] if c["status"] == "skipped"]
    assert {c.get("draft") for c in skipped} >= set(lineless), proc.stdout[-3000:]
    assert all("served as trained gives" in str(c.get("reason") or c.get("message")) for c in skipped
               if c.get("draft") in lineless)
