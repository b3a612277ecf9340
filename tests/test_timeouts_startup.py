"""The first engine call's deadline (harness.run.timeouts): what a hung first call costs, pinned,
and the start-up allowance derived from the measured construction for an engine whose
constructor does all its start-up. The hang itself is shown on a real bounded call that never
returns, at a scale that makes the deadline a fraction of a second."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from harness.reports.report import ConformanceFailure
from harness.run import timeouts

# the figure: a first call of 186 tokens of work (60 s + 600 s + 0.5 s x 186)
FIRST_CALL_WORK = 186


def test_what_a_hung_first_call_costs() -> None:
    """753 s for an engine that starts lazily or does not say; 183 s for one that loads in
    its constructor in about a second (the reference, the zoo)."""
    lazy = timeouts.CallBudget()
    assert lazy.seconds(FIRST_CALL_WORK, first=True) == pytest.approx(753.0)
    measured = timeouts.CallBudget(measured_startup_s=0.8)
    assert measured.seconds(FIRST_CALL_WORK, first=True) == pytest.approx(60 + 30 + 93)
    assert measured.seconds(FIRST_CALL_WORK, first=False) == lazy.seconds(FIRST_CALL_WORK, first=False)


@pytest.mark.parametrize("construction_s, allowance_s", [
    (0.0, timeouts.STARTUP_FLOOR_S),   # cached: the floor
    (0.8, timeouts.STARTUP_FLOOR_S),
    (12.0, 120.0),                     # ten times the construction
    (500.0, 600.0),                    # never more than the fixed allowance
])
def test_first_call_allowance_follows_the_construction(construction_s: float, allowance_s: float) -> None:
    budget = timeouts.CallBudget(measured_startup_s=construction_s)
    assert budget.first_call_startup_s() == pytest.approx(allowance_s)


class _Eager:
    starts_in_constructor = True


class _Lazy:
    pass


def test_start_measured_times_only_an_engine_that_says_it_starts_in_its_constructor() -> None:
    def slow() -> object:
        time.sleep(0.05)
        return object()

    _, eager = timeouts.start_measured(slow, timeouts.CallBudget(), _Eager)
    _, lazy = timeouts.start_measured(slow, timeouts.CallBudget(), _Lazy)
    assert eager.measured_startup_s is not None and eager.measured_startup_s >= 0.05
    assert lazy.measured_startup_s is None


def test_which_engines_start_in_their_constructor() -> None:
    """The reference and every zoo mutant load both models in __init__; a worker-process
    engine (vLLM, SGLang) starts its draft's worker on the first call (its allowance comes
    from the target worker's start it measured, below); an adapter that does not say keeps
    the fixed allowance (the base class default)."""
    from harness.engines._worker_engine import WorkerEngine
    from harness.engines.base import Engine
    from harness.engines.reference import ReferenceEngine
    from harness.engines.zoo import MUTANTS

    assert ReferenceEngine.starts_in_constructor and not Engine.starts_in_constructor
    assert not WorkerEngine.starts_in_constructor
    classes = [m if isinstance(m, type) else type(m) for m in MUTANTS.values()]
    assert all(getattr(c, "starts_in_constructor", False) for c in classes if issubclass(c, ReferenceEngine))


class _HangsOnFirstCall:
    """An in-process engine whose first generate never returns (until released)."""

    name = "hangs"

    def __init__(self) -> None:
        self.release = threading.Event()

    def capture(self, prompts: list[list[int]]) -> None:
        return None

    def generate(self, prompts: list[list[int]], max_new_tokens: int, speculative: bool = True) -> None:
        self.release.wait(30)

    def decode_inputs(self, prompts: list[list[int]], max_new_tokens: int) -> None:
        return None


def test_a_hung_first_call_ends_at_its_derived_deadline(tmp_path: Path) -> None:
    """The hang test of `run` (and so of each selftest run): the first call of an engine
    measured to start at once is a `hang` finding after scale x (60 + 30 + 0.5 x work) s,
    and the engine's later calls are skipped, not waited for."""
    scale = 0.004
    engine, budget = timeouts.start_measured(_HangsOnFirstCall, timeouts.CallBudget(scale=scale), _Eager)
    assert budget.measured_startup_s is not None and budget.first_call_startup_s() == timeouts.STARTUP_FLOOR_S
    hung: list[str] = []
    timeouts.BoundedCalls(engine, budget, on_hang=hung.append)
    expected = budget.seconds(timeouts.call_work("generate", ([[1, 2, 3]], 4, True)), first=True)
    start = time.monotonic()
    try:
        with pytest.raises(ConformanceFailure, match="did not return within"):
            engine.generate([[1, 2, 3]], 4, True)
        took = time.monotonic() - start
        assert expected <= took < expected + 2.0, (expected, took)
        assert hung and "hung earlier" in hung[0]
        with pytest.raises(pytest.skip.Exception):
            engine.capture([[1]])
    finally:
        engine.release.set()
        timeouts.join_abandoned(5)


class _LazyMeasured:
    """An engine that starts lazily but measured a start-up of the same kind (vLLM's target
    worker in its constructor)."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds

    def startup_measured_s(self) -> float | None:
        return self.seconds


@pytest.mark.parametrize("measured_s, allowance_s", [
    (12.0, 120.0),                      # ten times the measured start
    (1.0, timeouts.STARTUP_FLOOR_S),
    (90.0, 600.0),                      # never more than the fixed allowance
    (None, 600.0),                      # nothing measured: the fixed allowance
])
def test_a_lazy_engine_that_measured_its_start_gets_a_derived_allowance(
        measured_s: float | None, allowance_s: float) -> None:
    _, budget = timeouts.start_measured(lambda: _LazyMeasured(measured_s), timeouts.CallBudget(),
                                        _LazyMeasured)
    assert budget.first_call_startup_s() == pytest.approx(allowance_s)


def test_a_worker_engine_reports_its_target_workers_measured_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The vLLM/SGLang path for real: a WorkerEngine that starts its target-only worker in
    the constructor (a real process, tests/dying_worker.py standing in for the engine) reports
    that worker's measured start, and the first call's deadline follows it — not 753 s."""
    import os

    from harness.engines._worker_engine import WorkerEngine
    from harness.engines.base import EngineOptions

    here = Path(__file__).resolve().parent
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(here), os.environ.get("PYTHONPATH")])))
    from dying_worker import Handle

    class _Workers(WorkerEngine):
        name = "workers"
        label = "workers"
        handle_cls = Handle

        def __init__(self, target_dir: Path, draft_dir: Path, options: EngineOptions) -> None:
            super().__init__(target_dir, draft_dir, options)
            self._plain()  # as the vLLM and SGLang adapters do

        def _spec_for(self, draft: bool, scratch: Path) -> dict:
            return {"log_path": str(scratch / "worker.log"), "env": {}}

        def version(self) -> str:
            return "0"

    engine, budget = timeouts.start_measured(lambda: _Workers(tmp_path, tmp_path, EngineOptions()),
                                             timeouts.CallBudget(), _Workers)
    try:
        measured = engine.startup_measured_s()
        assert measured is not None and 0 < measured < 60, measured
        assert budget.measured_startup_s == measured
        assert budget.seconds(FIRST_CALL_WORK, first=True) < 753.0
        assert budget.first_call_startup_s() == pytest.approx(
            min(600.0, max(timeouts.STARTUP_FLOOR_S, timeouts.STARTUP_FACTOR * measured)))
    finally:
        engine.close()
        _Workers.stop_shared()
