"""The bug zoo is a fair exam: every mutant is registered the way `selftest` reads it, changes
exactly one wiring hook, cites the public report of its bug, and really changes what the
draft sees or proposes on the committed bundle (a silent no-op mutant would make the mutation
score meaningless). Its speculative output stays lossless: these bugs are silent in the
tokens, which is why the suite exists. No suite runs here; `eagle3-conformance selftest`
does that."""

from __future__ import annotations

import inspect
import re
import time
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.diagnosis.crash import crash_diagnosis
from harness.diagnosis.record import KINDS
from harness.engines.base import EngineOptions
from harness.engines.reference import ReferenceEngine
from harness.engines.speculative import Eagle3Runtime
from harness.engines.zoo import MUTANTS, Mutant
from harness.golden.bundle import BundleError, load_bundle
from harness.golden.draft_factory import FORMATS, DraftFactory
from harness.golden.paths import default_bundle_path
from harness.run.registry import known_names, resolve_engine
from harness.run.timeouts import EngineHang, call_with_deadline

HOOKS = ("capture_boundaries", "take_state", "combine", "project", "draft_step_hidden",
         "map_draft_ids", "rollback", "layer_is_moe", "refeed_features", "draft_positions",
         "draft_cache")
# "owner/repo#123", "PR #123", "issue #123": a reference someone can open.
ISSUE = re.compile(r"([\w.-]+/[\w.-]+#\d+|PR #\d+)")
NEW_TOKENS = 24
NUM_PROMPTS = 3
# the reference's capture of 3 prompts takes well under a second, even on a loaded machine; a
# mutant whose capture never returns is observed to differ (zoo:capture_hangs)
HANG_S = 15.0


@pytest.mark.parametrize("key", sorted(MUTANTS))
def test_mutant_is_registered_for_selftest(key: str) -> None:
    cls = MUTANTS[key]
    assert resolve_engine(f"zoo:{key}") is cls and f"zoo:{key}" in known_names()
    assert issubclass(cls, ReferenceEngine) and not inspect.isabstract(cls)
    assert cls.name == f"zoo:{key}", "name is what --engine takes, so reproducers work"
    assert cls.bug_class.strip() and cls.expected_diagnosis_kind in KINDS
    assert cls.expected_diagnosis_kind != "ok"
    assert ISSUE.search(cls.__doc__ or ""), f"{key}: the docstring must cite the public issue"
    assert ISSUE.search(cls.issue)


@pytest.mark.parametrize("key", sorted(MUTANTS))
def test_mutant_overrides_exactly_its_one_hook(key: str) -> None:
    cls = MUTANTS[key]
    own = {h for h in HOOKS if h in vars(cls)}
    assert own == {cls.hook}, f"{key} overrides {sorted(own)}, declares {cls.hook!r}"
    assert getattr(cls, cls.hook) is not getattr(Eagle3Runtime, cls.hook)
    assert not ({h for h in HOOKS if h in vars(Mutant)}), "the shared base must stay bug-free"


def test_every_root_cause_has_a_mutant() -> None:
    """A diagnosis class no mutant produces is one the selftest never proves the suite names.
    `engine_cannot_express` is a real engine's refusal read from its own message (llama.cpp's
    asserts), proven against llama.cpp itself in tests/test_llamacpp_verdict.py, not a bug a
    mutant could plant in the reference."""
    produced = {c.expected_diagnosis_kind for c in MUTANTS.values()}
    assert set(KINDS) - produced == {"ok", "unrecognised", "engine_crash", "engine_cannot_express"}, \
        sorted(set(KINDS) - produced)


def test_mutant_names_are_unique_and_enough() -> None:
    assert len(MUTANTS) >= 12
    assert len({c.name for c in MUTANTS.values()}) == len(MUTANTS)
    assert len({c.bug_class for c in MUTANTS.values()}) == len(MUTANTS)


# -- on the committed bundle ------------------------------------------------------------------


@cache
def _bundle() -> Any:
    try:
        return load_bundle(default_bundle_path(), verify_hashes=False)
    except BundleError as e:
        pytest.skip(f"committed bundle unavailable: {e}")


def _engine(cls: type[ReferenceEngine], draft: str) -> ReferenceEngine:
    b = _bundle()
    spec = b.draft(draft)
    return cls(b.target_dir, b.draft_dir(draft),
               EngineOptions(num_draft_tokens=spec.num_draft_tokens,
                             training_convention=spec.convention))


def _prompts() -> list[list[int]]:
    """The longest pinned prompts: most tokens to capture, most rounds to draft."""
    return sorted(_bundle().prompts(), key=len)[-NUM_PROMPTS:]


class _Observed:
    """One engine on one draft, computed lazily: capture first (cheap), generation only when
    the capture shows nothing. A mutant may crash where the real engine crashes; that is kept
    as the observation."""

    def __init__(self, cls: type[ReferenceEngine], draft: str) -> None:
        self.cls, self.draft = cls, draft
        self.error: str | None = None
        self.hung: str | None = None
        self._capture: Any = None
        self._generation: Any = None

    def _run(self, what: str) -> Any:
        engine = _engine(self.cls, self.draft)
        try:
            if what == "capture":
                return call_with_deadline(engine.capture, (_prompts(),), HANG_S, "capture")
            return engine.generate(_prompts(), NEW_TOKENS, speculative=True)
        except EngineHang as e:  # observable: the reference returns on the same call
            self.error = self.hung = str(e)
            return None
        except RuntimeError as e:
            self.error = str(e).splitlines()[0][:120]
            return None
        finally:
            engine.close()

    @property
    def capture(self) -> Any:
        if self._capture is None and self.error is None:
            self._capture = self._run("capture")
        return self._capture

    @property
    def generation(self) -> Any:
        if self._generation is None and self.error is None:
            self._generation = self._run("generate")
        return self._generation


@cache
def _observed(cls: type[ReferenceEngine], draft: str) -> _Observed:
    return _Observed(cls, draft)


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(x.shape == y.shape and torch.allclose(x, y, rtol=1e-4, atol=1e-5)
               for x, y in zip(a, b, strict=True))


def _crash_named(key: str, draft: str, error: str) -> bool:
    """Whether the suite's crash diagnosis (as the plugin calls it) names the mutant's own
    kind from its crash: then the crash is what the suite sees of the bug (a capture over
    several processes that feeds fc a shard, or the last pipeline stage's slots alone)."""
    spec = _bundle().draft(draft)
    engine = _engine(MUTANTS[key], draft)
    try:
        diag = crash_diagnosis(error, spec.layer_ids, _bundle().hidden_size,
                               engine_convention=engine.convention, training_boundaries=spec.boundaries,
                               num_layers=engine.num_layers,
                               pipeline_stages=getattr(engine, "pipeline_stages", None))
    finally:
        engine.close()
    return diag.kind == MUTANTS[key].expected_diagnosis_kind


def _capture_differs(key: str, draft: str) -> bool:
    ref, got = _observed(ReferenceEngine, draft), _observed(MUTANTS[key], draft)
    if got.capture is None:
        # hung: differs; crashed: only where the crash names the bug (else nothing the suite
        # could diagnose)
        return got.hung is not None or (got.error is not None and _crash_named(key, draft, got.error))
    return not (_same(got.capture.features, ref.capture.features)
                and _same(got.capture.fc_out, ref.capture.fc_out))


def _proposals_differ(key: str, draft: str) -> bool:
    ref, got = _observed(ReferenceEngine, draft), _observed(MUTANTS[key], draft)
    if got.generation is None:
        return False
    assert got.generation.tokens == ref.generation.tokens, \
        f"{key} on {draft}: speculative output differs from the reference's: not lossless"
    return got.generation.proposed != ref.generation.proposed


# caught only by the layer-id check's drawn drafts; the decode-time and history mutants name
# their check too (`caught_by`) but show on the bundle's drafts
DRAWN_ONLY = sorted(k for k, c in MUTANTS.items() if c.caught_by == "test_layer_ids.py::")
BUNDLE_VISIBLE = sorted(k for k, c in MUTANTS.items() if c.observable == "wiring" and k not in DRAWN_ONLY)
# Factory drafts outside the bundle's lists: unsorted, first id 1, both layouts, the trainers.
DRAWN_DRAFTS = [((1, 5, 3), layout, told) for layout in FORMATS
                for told in ("specforge", "eagle3-original")]


WIRING = sorted(k for k, c in MUTANTS.items() if c.observable == "wiring")
THROUGHPUT = sorted(k for k, c in MUTANTS.items() if c.observable == "throughput")


def test_every_mutant_declares_what_it_changes() -> None:
    assert set(WIRING) | set(THROUGHPUT) == set(MUTANTS), \
        f"observable must be 'wiring' or 'throughput': {[(k, c.observable) for k, c in MUTANTS.items()]}"


@pytest.mark.parametrize("key", THROUGHPUT)
def test_throughput_mutant_is_lossless_and_slower(key: str) -> None:
    """A throughput mutant keeps the wiring (same tokens, same drafts) and only costs time:
    its speculative run takes longer than the reference's on the same prompts (each the
    minimum of two runs, the stall being a multiple of the round)."""
    draft = _bundle().draft_names[0]

    def fastest(cls: type[ReferenceEngine]) -> tuple[float, Any]:
        engine = _engine(cls, draft)
        try:
            best, gen = float("inf"), None
            for _ in range(2):
                t0 = time.perf_counter()
                gen = engine.generate(_prompts(), NEW_TOKENS, speculative=True)
                best = min(best, time.perf_counter() - t0)
            return best, gen
        finally:
            engine.close()

    ref_s, ref = fastest(ReferenceEngine)
    got_s, got = fastest(MUTANTS[key])
    assert got.tokens == ref.tokens and got.proposed == ref.proposed, \
        f"{key} changed the wiring, not only the time"
    factor = MUTANTS[key].factor
    assert got_s > ref_s * (1 + (factor - 1) / 2), \
        f"{key}: speculative run {got_s:.3f}s vs reference {ref_s:.3f}s, not slowed by ~{factor}x"


@pytest.mark.parametrize("key", [
    pytest.param(k, marks=pytest.mark.slow(reason="waits out the hung capture's deadline (~15 s)"))
    if k == "capture_hangs" else k for k in BUNDLE_VISIBLE])
def test_mutant_changes_what_the_draft_sees_or_proposes(key: str) -> None:
    """Some bundle draft exposes the bug in the captured features or fc output (checked on
    every draft first: cheap) or else in the drafted tokens, with the reference as the
    control on the same prompts."""
    drafts = _bundle().draft_names
    if any(_capture_differs(key, d) for d in drafts):
        return
    if any(_proposals_differ(key, d) for d in drafts):
        return
    errors = {d: _observed(MUTANTS[key], d).error for d in drafts}
    pytest.fail(f"{key} is a silent no-op on every bundle draft {drafts} (errors: {errors})")


@pytest.mark.parametrize("key", DRAWN_ONLY)
def test_drawn_ids_mutant_is_exact_on_the_bundle_and_wrong_elsewhere(key: str, tmp_path: Path) -> None:
    """A mutant the selftest demands the layer-id check catch (`caught_by`) must be invisible
    to the fixed-draft checks (every bundle draft captured exactly as by the reference), or the
    item proves nothing, and must change the capture of some factory draft."""
    drafts = _bundle().draft_names
    assert MUTANTS[key].caught_by == "test_layer_ids.py::"
    visible = [d for d in drafts if _capture_differs(key, d) or _observed(MUTANTS[key], d).error]
    assert not visible, f"{key} already shows on bundle drafts {visible}"
    factory = DraftFactory(_bundle(), tmp_path)
    differs = []
    for ids, layout, told in DRAWN_DRAFTS:
        options = EngineOptions(training_convention=told)
        captures = []
        for cls in (ReferenceEngine, MUTANTS[key]):
            engine = cls(_bundle().target_dir, factory.folder(ids, layout), options)
            try:
                captures.append(engine.capture(_prompts()).features)
            except RuntimeError:  # a crash on the width is a difference too
                captures.append(None)
            finally:
                engine.close()
        if captures[1] is None or not _same(captures[0], captures[1]):
            differs.append((ids, layout, told))
    assert differs, f"{key} captures every drawn draft {DRAWN_DRAFTS} as the reference does"


def test_diagnoses_doc_lists_every_kind_and_mutant() -> None:
    """docs/DIAGNOSES.md is what a user reads when a check fails: it must not fall behind."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "DIAGNOSES.md").read_text()
    missing = [k for k in KINDS if k != "ok" and f"`{k}`" not in text]
    missing += [m for m in MUTANTS if f"`{m}`" not in text]
    assert not missing, f"docs/DIAGNOSES.md does not mention {missing}"
