"""Layer ids drawn by Hypothesis: every engine's reading of ids, mapped, certified, and every
suggested fix verified.

The bundle's drafts carry four fixed id lists; an engine that is right on those and misreads
any other list (SGLang deepseek_v2's "+1 only if the first id is 1", a runner that drops
top-level ids, slots re-sorted) passes every fixed-draft check. Here the engine serves drafts
built for drawn ids (`harness.golden.draft_factory`), in both config layouts, and:

- the property: each slot holds the boundary the draft's training convention means, in config
  order (a reference-like engine is told the convention and may be drawn any trainer's; an
  engine declaring its own rule claims the drafts trained with that rule, in list order);
- the probes: a few lists that tell the candidate rules apart, judged against the rule the
  engine declares; they and every other config served feed the report's observed convention;
- the remedies: a bundle draft whose capture is diagnosed with a remedy that is a config
  change (harness.diagnosis.remedy) is re-served as a remedied copy ("verified" /
  "unverified: <why>"); where the remedy is an engine change, the literal ids are served to
  show what the engine does instead;
- the lint: duplicate and out-of-range ids are rejected before any engine runs.

Engines are expensive (a vLLM worker takes ~15 s to start on a CPU), so one engine per
(layout, ids, told convention) serves every example, probe and fix naming that config.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import pytest
import torch
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from harness.core.boundaries import (
    Convention,
    LayerIdError,
    boundaries_to_ids,
    get_convention,
    ids_to_boundaries,
)
from harness.diagnosis.capture import separating_probe, shift_or_local
from harness.diagnosis.crash import crash_diagnosis
from harness.diagnosis.observed_convention import (
    TRAINERS,
    Observation,
    disagreements,
    fix_result,
    literal_ids,
    trained_as,
)
from harness.diagnosis.record import Diagnosis
from harness.diagnosis.remedy import (
    UNVERIFIED,
    VERIFIED,
    ConfigChange,
    failed_text,
    plan,
    verified_text,
)
from harness.diagnosis.remedy import entry as remedy_entry
from harness.engines.base import (
    Capability,
    Capture,
    ConfigInexpressible,
    Engine,
    EngineCrash,
    EngineOptions,
    EngineUnavailable,
)
from harness.golden.bundle import Bundle, DraftSpec
from harness.golden.draft_factory import FORMATS, NESTED, DraftFactory
from harness.golden.oracle import Oracle
from harness.judgement.assertions import (
    CaptureContext,
    ConformanceFailure,
    assert_convention_as_declared,
    assert_fc_matches,
    assert_fix_holds,
    judge_capture_oracle,
    require,
)
from harness.judgement.lint import lint_draft
from harness.judgement.precision import reference_fc
from harness.run.profiles import layer_id_examples, layer_id_startup_budget_s
from harness.run.strategies import invalid_layer_id_configs, layer_id_configs, pinned_prompt_rows
from harness.run.timeouts import (
    CallBudget,
    EngineHang,
    call_with_deadline,
    call_work,
    hang_diagnosis,
    start_measured,
)

# Lists that tell the candidate rules apart: [1, 5, 3] is unsorted (slot order) and starts
# with 1 (SGLang PR #25454's condition), [4] does not; [-1, 4] only for "-1 = embedding".
PROBES = ((1, 5, 3), (4,), (-1, 4))
ID_FIELD = "eagle_aux_hidden_state_layer_ids"


# the start of the answer for a config not started because an earlier one hung
NOT_SERVED = "not served: "


@dataclass
class Served:
    """One config served on some prompts: the capture diagnosis, or the crash."""

    ids: tuple[int, ...]
    layout: str
    diagnosis: Diagnosis | None = None
    crash: str | None = None
    failure: ConformanceFailure | None = None

    @property
    def slots(self) -> list | None:
        return None if self.diagnosis is None else list(self.diagnosis.engine_boundaries)


class ServedDrafts:
    """Engines for factory drafts, one per config, the last one kept alive and every capture
    memoised. A config that crashed the engine is not started again: the crash comes from its
    ids (vLLM's id-0 TypeError is raised at the first capture, whatever the prompt), and a
    restart per Hypothesis shrink step would cost minutes; the failure says so. After one config
    hung, no other config is started: each would wait out its own start-up and capture
    deadlines (zoo:capture_hangs took an hour at a quarter of the deadlines), and the engine has
    already failed; those configs carry the first hang's finding, saying they were not served."""

    def __init__(self, engine_class: type, options: EngineOptions, factory: DraftFactory,
                 oracle: Oracle, report, deadlines: CallBudget | None = None) -> None:
        self.engine_class, self.options, self.factory = engine_class, options, factory
        self.oracle, self.report = oracle, report
        self.num_layers = oracle.bundle.num_layers
        # the engine's rule for this target (vLLM's depends on the architecture), or None
        # where it honours the training convention it is told
        self.engine_convention = engine_class.convention_for_target(oracle.bundle.target_dir)
        self._crashes: dict[tuple, tuple[str, list]] = {}
        self._captures: dict[tuple, Capture] = {}
        self._live: tuple[tuple, Engine] | None = None
        self._hung: tuple[tuple[int, ...], EngineHang, Diagnosis] | None = None  # the first hang
        self._first = True  # the live engine's next call is its first (start-up allowance)
        self.budget_s: float | None = None  # start-up seconds left to the running property
        self.rejected = 0
        # set by the drawing property around its serve: a config the engine cannot be wired for
        # (ConfigInexpressible) is then turned away and counted (the first reason kept), not a
        # skip of the whole property
        self.drawing = False
        self.inexpressible: list[str] = []
        # the run's engine deadlines (--engine-timeout-scale), as every other check has them:
        # a config whose capture never returns is a hang, recorded like a crash
        self.deadlines = deadlines or CallBudget(scale=0)
        # the live engine's: its first call's allowance derived from its start-up measured
        self._budget = self.deadlines

    def limit(self, seconds: float | None) -> None:
        """Start-up seconds the next calls may spend on new configs (None: no limit)."""
        self.budget_s, self.rejected, self.inexpressible = seconds, 0, []

    def is_new(self, ids: Sequence[int], layout: str, told: str | None) -> bool:
        """Never served: serving it needs an engine start (a served config is answered from
        its pinned-prompt capture or its crash)."""
        key = (tuple(ids), layout, self.told_key(told), None)
        return key not in self._crashes and not any(k == key for k, _ in self._captures)

    def told_key(self, told: str | None) -> str | None:
        """Only an engine that honours training reads the convention it is told."""
        return told if self.engine_convention is None else None

    def _engine(self, key: tuple) -> Engine:
        if self._live is not None and self._live[0] == key:
            return self._live[1]
        self.close()
        ids, layout, told, source = key
        # a factory draft for the ids, or a remedied copy of a bundle draft (source: ("remedy",
        # draft, slot order); harness.diagnosis.remedy)
        folder = (self.factory.folder(ids, layout) if source is None else
                  self.factory.remedied(source[1], ids, layout, source[2]))
        started = time.monotonic()
        try:
            engine, self._budget = start_measured(lambda: self.engine_class(
                self.oracle.bundle.target_dir, folder,
                replace(self.options, training_convention=told)), self.deadlines,
                self.engine_class)
            self._first = True
        except EngineUnavailable as e:
            if self.drawing and isinstance(e, ConfigInexpressible):
                self.inexpressible.append(str(e))
                reject()  # the engine serves other configs: draw one of those
            pytest.skip(f"engine {self.engine_class.name} unavailable: {e}")
        finally:
            if self.budget_s is not None:
                self.budget_s -= time.monotonic() - started
        self._live = (key, engine)
        return engine

    def capture(self, ids: Sequence[int], layout: str, told: str | None,
                batch: Sequence[Sequence[int]], source: tuple | None = None) -> Capture | tuple[str, list]:
        """The capture, or (crash message, its diagnoses). A batch of pinned prompts is cut from
        one capture of the whole pinned set, so a config once served never needs its engine
        again (Hypothesis replays and shrinks without start-ups)."""
        ids = tuple(ids)
        key = (ids, layout, self.told_key(told), source)
        if key in self._crashes:
            return self._crashes[key]
        pinned = [tuple(p) for p in self.oracle.pinned_prompts]
        wanted = [tuple(p) for p in batch]
        if all(p in pinned for p in wanted):
            whole = self.capture(ids, layout, told, pinned, source) if wanted != pinned else None
            if whole is not None:
                if isinstance(whole, tuple):
                    return whole
                rows = [pinned.index(p) for p in wanted]
                return Capture(features=[whole.features[i] for i in rows],
                               fc_out=None if whole.fc_out is None else [whole.fc_out[i] for i in rows])
        memo = (key, tuple(wanted))
        if memo not in self._captures and self._hung is not None:
            hung_ids, hang, diagnosis = self._hung
            return (f"{NOT_SERVED}the engine gave no answer on ids {list(hung_ids)} earlier "
                    f"in this run ({hang}), and no config is started after a hang", [diagnosis])
        if memo not in self._captures:
            try:
                engine = self._engine(key)
                work = call_work("capture", (batch,))
                seconds = self._budget.deadline(work, self._first)
                self._first = False
                self._captures[memo] = call_with_deadline(engine.capture, (batch,), seconds,
                                                          "capture", work)
            except EngineHang as hang:
                diagnosis = hang_diagnosis(self.engine_class.name, hang)
                self._crashes[key] = (f"no answer: {hang}", [diagnosis])
                self._hung = (ids, hang, diagnosis)
                self.close()
                return self._crashes[key]
            except (EngineCrash, RuntimeError) as crash:
                # a RuntimeError is an in-process engine failing on this draft (the reference's
                # fc on a capture of the wrong width): a crash too, diagnosed from its text
                first = (str(crash).strip().splitlines() or ["engine failure"])[0]
                if not isinstance(crash, EngineCrash):
                    first = f"{type(crash).__name__}: {first}"
                self._crashes[key] = (first, [crash_diagnosis(
                    str(crash), ids, self.oracle.bundle.hidden_size,
                    **self._placement_context(ids, told))])
                self.close()
                return self._crashes[key]
        return self._captures[memo]

    def _placement_context(self, ids: Sequence[int], told: str | None) -> dict:
        """What names a capture of the last pipeline stage alone in a crash: the live engine's
        declared stages and the boundaries training meant (harness.diagnosis.placement)."""
        stages = getattr(self._live[1], "pipeline_stages", None) if self._live else None
        if not stages or told is None:
            return {}
        try:
            trained = ids_to_boundaries(ids, told, self.oracle.bundle.num_layers)
        except LayerIdError:
            return {}
        return {"training_boundaries": trained, "pipeline_stages": stages}

    def serve(self, ids: Sequence[int], layout: str, told: str | None, trained: Sequence[int],
              batch: Sequence[Sequence[int]], check: str, source: tuple | None = None) -> Served:
        """Serve, judge against `trained` (assert_capture_matches), record the observation.
        `source`: serve a remedied copy of a bundle draft instead of the factory draft
        (`DraftFactory.remedied`); its capture reads the same ids, so it is observed the same."""
        ids = tuple(int(i) for i in ids)
        out = self.capture(ids, layout, told, batch, source)
        obs = dict(layout=layout, ids=ids, num_layers=self.num_layers, told=self.told_key(told))
        if isinstance(out, tuple):
            message, diagnoses = out
            self.report.observe(Observation(crash=message, **obs))
            what = "was not served" if message.startswith(NOT_SERVED) else "crashed the engine"
            return Served(ids, layout, crash=message, failure=ConformanceFailure(
                f"ids {list(ids)} ({layout} config) {what}: {message.removeprefix(NOT_SERVED)} "
                f"(a config that crashed is not restarted for other prompts)", diagnoses))
        pinned = self.oracle.pinned_prompts
        key = (ids, layout, self.told_key(told), source)

        def context() -> tuple[list, list, list]:
            # a shrunk example has a row or two: the whole pinned capture (cached) is the
            # evidence the diagnosis needs
            whole = self.capture(ids, layout, told, pinned, source)
            assert not isinstance(whole, tuple)  # it served the subset cut from it
            return list(pinned), whole.features, [self.oracle.features(p) for p in pinned]

        try:
            ctx = CaptureContext(
                training_boundaries=list(trained), config_ids=ids, dtype=self.options.dtype,
                engine_name=self.engine_class.name, draft=f"ids {list(ids)} ({layout})", check=check,
                engine_convention=self.engine_convention, more_evidence=context,
                # rows are cut from one capture of the pinned batch: each prompt served on its
                # own is the evidence that tells a batch-dependent capture from other causes
                in_batch=True,
                alone=lambda some: [self._engine(key).capture([p]).features[0] for p in some])
            judged = judge_capture_oracle(ctx, features=out.features, oracle=self.oracle, prompts=batch)
        except ConformanceFailure as f:  # a hung or crashed call, raised by the engine's wrapper
            diag, failure = f.diagnoses[0], f
        else:
            diag, failure = judged.diagnoses[0], judged.failure
        self.report.observe(Observation(slots=tuple(diag.engine_boundaries), **obs))
        return Served(ids, layout, diagnosis=diag, failure=failure)

    def check(self, *args, **kwargs) -> Diagnosis:
        served = self.serve(*args, **kwargs)
        if served.failure is not None:
            raise served.failure
        assert served.diagnosis is not None
        return served.diagnosis

    def close(self) -> None:
        if self._live is not None:
            self._live[1].close()
            self._live = None


@pytest.fixture(scope="session")
def draft_factory(bundle: Bundle, tmp_path_factory: pytest.TempPathFactory) -> DraftFactory:
    return DraftFactory(bundle, tmp_path_factory.mktemp("layer-id-drafts"))


@pytest.fixture(scope="session")
def served(engine_class: type, engine_options: EngineOptions, draft_factory: DraftFactory,
           oracle: Oracle, report, pytestconfig: pytest.Config) -> ServedDrafts:
    drafts = ServedDrafts(engine_class, engine_options, draft_factory, oracle, report,
                          CallBudget(scale=pytestconfig.getoption("engine_timeout_scale")))
    yield drafts
    drafts.close()


def told_conventions(engine_convention: str | Convention | None) -> dict[str, Convention]:
    """Whom the engine claims to serve: every trainer for an engine that is told the training
    convention (None); else the trainer its own rule describes (`trained_as`)."""
    if engine_convention is None:
        return {name: get_convention(name) for name in TRAINERS}
    conv = trained_as(engine_convention)
    return {conv.name: conv}


_SLOW = [HealthCheck.too_slow, HealthCheck.filter_too_much]


@pytest.fixture
def budgeted(served: ServedDrafts, report, request: pytest.FixtureRequest) -> ServedDrafts:
    """`served` with this test's start-up budget (harness.run.profiles.LAYER_ID_STARTUP_BUDGET_S);
    how many drawn examples it turned away lands in the report."""
    served.limit(layer_id_startup_budget_s())
    yield served
    if served.rejected:
        report.metric("layer-ids", f"{request.node.name}: examples past the start-up budget",
                      served.rejected)
    if served.inexpressible:
        report.metric("layer-ids", f"{request.node.name}: examples the engine cannot be wired for",
                      {"count": len(served.inexpressible), "first": served.inexpressible[0]})
    served.limit(None)


def test_suggested_fix_verified(engine: Engine, oracle: Oracle, spec: DraftSpec, draft_name: str,
                                served: ServedDrafts, report) -> None:
    """A bundle draft whose capture is diagnosed is remedied where the remedy is a change of its
    config (harness.diagnosis.remedy.plan: the suggested ids, for ids_ignored in either layout;
    the ids the measured shift calls for, where the engine declares no convention; the ids in
    the engine's slot order with fc's input blocks permuted): a remedied copy of the draft is
    re-served and must capture exactly what it asks for ("verified"; else "unverified: <what it
    held>", and the check fails: the remedy does not hold). A remedy that is an engine change
    stays "unverified" with that reason; an engine that declares its convention is then served
    the literal ids, which must not work, and the report words what the engine did with them."""
    require(engine, Capability.CAPTURE)
    batch, n = oracle.pinned_prompts, served.num_layers
    check = f"test_suggested_fix_verified[{draft_name}]"
    try:
        capture = engine.capture(batch)
        diag = judge_capture_oracle(CaptureContext.for_engine(engine, spec, draft_name, check),
                                    features=capture.features, oracle=oracle, prompts=batch).diagnoses[0]
    except ConformanceFailure as failure:  # a hung call, raised by the engine's wrapper
        diag = failure.diagnoses[0]
    except EngineCrash as crash:
        diag = crash_diagnosis(str(crash), spec.layer_ids, oracle.bundle.hidden_size,
                               engine_convention=engine.convention, training_boundaries=spec.boundaries,
                               num_layers=n, pipeline_stages=getattr(engine, "pipeline_stages", None))
    assert diag is not None
    if diag.kind == "ok":
        report.fix(draft_name, {"ids": list(spec.layer_ids), "layout": None, "suggested": False,
                                "result": "no fix needed: the engine captures the training boundaries"})
        return
    changes = plan(diag, config_ids=spec.layer_ids, layout=NESTED, trained=spec.boundaries,
                   num_layers=n, told=served.told_key(spec.convention),
                   engine_convention=engine.convention)
    if not isinstance(changes, str):
        for change in changes:
            result = served.serve(change.ids, change.layout, spec.convention, change.expected, batch,
                                  check, source=("remedy", draft_name, change.slot_order))
            holds = result.failure is None
            fc_wrong = _permuted_fc_wrong(served, oracle, spec, draft_name, change, batch) if holds else None
            if holds and fc_wrong is None:
                text = verified_text(change)
                break
            if fc_wrong is not None:
                holds, text = False, failed_text(change, result.slots, None, fc_wrong)
                break
            detail = result.diagnosis.message if result.diagnosis is not None else ""
            text = failed_text(change, result.slots, result.crash, detail)
        report.fix(draft_name, remedy_entry(diag, VERIFIED if holds else UNVERIFIED, text, change,
                                            suggested=bool(diag.suggested_layer_ids)))
        assert_fix_holds(text, holds, [] if result.failure is None else result.failure.diagnoses)
        return
    why = changes
    if engine.convention is None:
        report.fix(draft_name, remedy_entry(diag, UNVERIFIED, f"{UNVERIFIED}: {why}",
                                            ids=list(spec.layer_ids), layout=None, suggested=False))
        pytest.skip(f"{draft_name}: {why}; {engine.name} declares no layer-id convention, so there "
                    f"is no literal id list to re-serve either")
    # the literal ids (what a user would try) must not work: the report words what they do
    ids = literal_ids(spec.boundaries, engine.convention, n)
    result = served.serve(ids, NESTED, spec.convention, spec.boundaries, batch, check)
    detail = result.diagnosis.message if result.diagnosis is not None else ""
    text, holds = fix_result(ids, NESTED, spec.boundaries, False, result.slots, result.crash, detail)
    text = f"{UNVERIFIED}: {why}; " + text.removeprefix("no fix: ")
    report.fix(draft_name, remedy_entry(diag, UNVERIFIED, text, ids=list(ids), layout=NESTED,
                                        suggested=False))
    assert_fix_holds(text, holds, [] if result.failure is None else result.failure.diagnoses)


def _permuted_fc_wrong(served: ServedDrafts, oracle: Oracle, spec: DraftSpec, draft_name: str,
                       change: ConfigChange, batch: Sequence[Sequence[int]]) -> str | None:
    """Where the remedied copy's fc input blocks are permuted (`change.slot_order`) and the engine
    exposes fc's output: why it is not the trained fc of the features in training's slot order
    (None: it is, or there is nothing to judge). The capture alone shows the slots in the copy's
    order; this shows the permuted weights undo that order."""
    if change.slot_order is None:
        return None
    cap = served.capture(change.ids, change.layout, spec.convention, batch,
                         ("remedy", draft_name, change.slot_order))
    if isinstance(cap, tuple) or cap.fc_out is None:
        return None
    draft = oracle.draft(draft_name)
    width, order = draft.cfg.target_hidden_size, list(change.slot_order)
    in_training_order = [torch.cat([f[..., order.index(p) * width:(order.index(p) + 1) * width]
                                    for p in range(len(order))], dim=-1) for f in cap.features]
    try:
        assert_fc_matches(fc_out=cap.fc_out, features=in_training_order,
                          expected=[oracle.fc(draft_name, f) for f in in_training_order],
                          dtype=served.options.dtype, draft_hidden=draft.cfg.hidden_size,
                          norm_before_fc=draft.cfg.norm_before_fc, fc_norm=draft.cfg.fc_norm,
                          engine_name=served.engine_class.name, draft=draft_name, prompts=batch,
                          same_dtype=reference_fc(oracle, draft_name, in_training_order,
                                                  served.options.dtype))
    except ConformanceFailure as failure:
        return f"fc's output on the copy is not the trained fc: {str(failure).splitlines()[0]}"
    return None


@pytest.mark.parametrize("layout", FORMATS)
@settings(max_examples=layer_id_examples(), report_multiple_bugs=False,
          suppress_health_check=[*_SLOW, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_drawn_layer_ids_served_as_trained(layout: str, engine_class: type, budgeted: ServedDrafts,
                                           oracle: Oracle, data: st.DataObject) -> None:
    """Hypothesis draws the training convention, 1..4 ids (embedding and final boundary
    included, any order) and 1..3 pinned prompts; each engine slot must hold the boundary the ids mean
    under that convention, in config order. Failures shrink to the shortest id list."""
    require(engine_class, Capability.CAPTURE)
    served = budgeted
    conventions = told_conventions(served.engine_convention)
    told = data.draw(st.sampled_from(sorted(conventions)), label="training convention")
    n = served.num_layers
    ids = data.draw(layer_id_configs(conventions[told], n), label="layer ids")
    pinned = oracle.pinned_prompts
    # Pinned prompts (lengths 1..32, committed golden features): a config is captured on all of
    # them at once, so examples and shrink steps on a served config cost no start-up.
    rows = data.draw(pinned_prompt_rows(len(pinned)), label="pinned prompts")
    trained = ids_to_boundaries(ids, conventions[told], n)
    told_name = told if told in TRAINERS else None
    if served.budget_s is not None and served.budget_s <= 0 and served.is_new(ids, layout, told_name):
        served.rejected += 1
        reject()  # past the start-up budget: only configs already served are drawn on
    check = f"test_drawn_layer_ids_served_as_trained[{layout}]"
    batch = [pinned[i] for i in rows]
    served.drawing = True
    try:
        result = served.serve(ids, layout, told_name, trained, batch, check)
    finally:
        served.drawing = False
    if result.failure is None:
        return
    raise separated(served, result.failure, conventions[told], layout, told_name, batch, check)


def separated(served: ServedDrafts, failure: ConformanceFailure, conv: Convention, layout: str,
              told: str | None, batch: Sequence[Sequence[int]], check: str) -> ConformanceFailure:
    """`failure`, its diagnosis settled by the separating experiment where the suite can run it
    (issue #31, item 2): a capture that fits a shift of every id and a dropped embedding alike
    (ids meaning [0], where shrinking ends; [0, N] held as [1, N]), or a shift and a fault at
    the one boundary off (a shrunk one-id list), is followed by a probe served the same way with
    that boundary and a middle one, which tells them apart (harness.diagnosis.capture.
    separating_probe, shift_or_local). Any other failure comes back as it was."""
    diag = failure.diagnoses[0] if failure.diagnoses else None
    n = served.num_layers
    probe_b = None if diag is None else separating_probe(diag, n)
    if diag is None or probe_b is None:
        return failure
    try:
        probe_ids = boundaries_to_ids(probe_b, conv, n)
    except LayerIdError:
        return failure  # the convention cannot write the probe: the ambiguity stays, worded
    probe = served.serve(probe_ids, layout, told, probe_b, batch, check)
    if probe.diagnosis is None:
        return failure
    named = shift_or_local(diag, probe.diagnosis)
    return ConformanceFailure(str(failure).replace(diag.message, named.message),
                              [named, *failure.diagnoses[1:]])


@pytest.mark.parametrize("layout", FORMATS)
def test_observed_convention_as_declared(layout: str, engine_class: type, served: ServedDrafts,
                                         oracle: Oracle, report) -> None:
    """The probes, and every config served before in this layout, read the way the engine's
    declared rule (for an engine that honours training: the told trainer's) says: ascending
    where it sorts, its defaults nowhere, its offset everywhere."""
    require(engine_class, Capability.CAPTURE)
    n, batch = served.num_layers, oracle.pinned_prompts
    check = f"test_observed_convention_as_declared[{layout}]"
    judged = []
    for told, conv in told_conventions(served.engine_convention).items():
        declared = served.engine_convention or told
        told_name = told if told in TRAINERS else None
        diagnoses: list[Diagnosis] = []
        for ids in PROBES:
            try:
                ids_to_boundaries(ids, conv, n)  # a list this trainer writes
                expected = ids_to_boundaries(ids, declared, n)  # what the declared rule captures
            except LayerIdError:
                continue
            result = served.serve(ids, layout, told_name, expected, batch, check)
            if result.failure is not None:
                diagnoses.extend(result.failure.diagnoses)
        judged.append((declared, told_name, diagnoses))
    for declared, told_name, diagnoses in judged:  # every told convention probed before any verdict
        key = served.told_key(told_name)
        seen = [Observation.from_json(o) for o in report.observations.values()
                if o["layout"] == layout and o.get("told") == key]
        # a list served earlier in the run (a drawn one) that disagrees carries evidence the
        # probes may not (the final boundary, the embedding): its diagnosis is part of this
        # verdict's, re-judged from the run's cached capture, never "unrecognised" by omission
        for o in [o for o in seen if o.ids not in PROBES and disagreements(declared, [o])][:3]:
            expected = ids_to_boundaries(o.ids, declared, n)
            result = served.serve(o.ids, layout, told_name, expected, batch, check)
            if result.failure is not None:
                diagnoses.extend(separated(served, result.failure, get_convention(declared),
                                           layout, told_name, batch, check).diagnoses)
        assert_convention_as_declared(declared, layout, seen, diagnoses)


@settings(max_examples=25, suppress_health_check=_SLOW)
@given(data=st.data())
def test_config_lint_rejects_invalid_ids(bundle: Bundle, draft_factory: DraftFactory,
                                         data: st.DataObject) -> None:
    """Duplicate ids and ids past either end never reach an engine: the lint names the field
    and the offending list in one line. A valid list draws no id complaint (the lint must not
    cry wolf). SpecForge layout (the lint reads the bundle's convention)."""
    target_cfg = json.loads((bundle.target_dir / "config.json").read_text())
    n = bundle.num_layers
    convention = data.draw(st.sampled_from(["specforge", "embedding-minus-one"]), label="convention")
    invalid = data.draw(st.booleans(), label="invalid")
    ids = data.draw(invalid_layer_id_configs(convention, n) if invalid else layer_id_configs(convention, n),
                    label="layer ids")
    problems = [p for p in lint_draft(draft_factory.folder(ids, NESTED), target_cfg, convention)
                if p.field.endswith(ID_FIELD)]
    if invalid and not problems:
        raise ConformanceFailure(f"the config lint accepted invalid ids {list(ids)} ({convention}); "
                                 f"it must reject duplicates and ids outside the target")
    if not invalid and problems:
        raise ConformanceFailure(f"the config lint rejected valid ids {list(ids)} ({convention}): "
                                 f"{problems[0]}")
    if invalid:
        named = str(problems[0])
        dup = [i for i in ids if list(ids).count(i) > 1]
        assert any(str(i) in named for i in (dup or ids)), f"lint message names no id: {named}"
