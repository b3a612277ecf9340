"""Bounds on engine calls: a hung engine ends as a failed check with a `hang` diagnosis, and
the rest of the suite runs.

Every call of the adapter protocol that runs the engine (`capture`, `generate`, and the
constructor, which loads the models) runs in a daemon worker thread that the check waits for
with a deadline. The deadline is scaled to the work: a fixed allowance, plus a per-token
allowance over the tokens the call must process, plus a start-up allowance on the first
call of an engine (the vLLM adapter starts its worker processes lazily, on the first call).
`--engine-timeout-scale` multiplies all of it (0 turns the bounds off).

Why these numbers: the whole suite against vLLM on the 2-core CPU machine, start-up and
every call included, takes about 4 minutes, so no single call of it takes longer; the first
call's allowance (60 s + 600 s + 0.5 s per token) is over twice that before any per-token
allowance, and a later call's 60 s + 0.5 s per token is far beyond what the tiny bundle's
calls take (milliseconds per token). A slow machine is not mistaken for a hung engine, and a
hang costs minutes, not forever. Raise the scale on a slower machine or a bigger bundle.

The first call's start-up allowance, measured where the engine lets it be: an adapter whose
constructor does all the start-up (`Engine.starts_in_constructor`: the reference and the zoo)
has its construction timed, and its first call gets STARTUP_FACTOR times that (at least
STARTUP_FLOOR_S, at most the fixed 600 s) instead of the fixed allowance: whatever a first
call still initialises (allocator, lazy kernels) costs less than loading both models did, so
ten times the load is a wide margin, and the floor covers a construction that was quick
because it was cached. An engine that starts lazily says what it measured instead
(`Engine.startup_measured_s`): vLLM's and SGLang's adapters start the target alone in their
constructor and the engine with the draft on the first call, the same start with a draft on
top, so ten times the measured target start bounds it. What a hung first call costs at scale
1, on the tiny bundle's largest first call (186 tokens of work: +93 s): 60 + 30 + 93 = 183 s
for the reference engine and every zoo mutant, whose constructions take about a second;
60 + 10 x (the measured target start, at most 600) + 93 for vLLM and SGLang; 753 s only for an
adapter that neither starts in its constructor nor measures anything (a correct engine must
not be called hung for starting up). tests/test_timeouts_startup.py pins these figures.

What a timeout can and cannot do: Python cannot kill a thread. An engine that runs in
worker processes (vLLM) is stopped by closing it (the adapter kills its workers; its worker
protocol also gives up on a reply after a fixed 900 s, `_vllm_worker.CALL_TIMEOUT_S`). An
in-process engine (the reference, a zoo mutant, most user adapters) keeps its daemon thread
spinning until the process exits; the suite marks the engine hung, skips its remaining
checks with that reason, and the process exits normally at the end (daemon threads do not
hold it). A hang that holds the GIL in C code without releasing it would block the suite
too; no in-process watchdog can help there (run such an engine out of process).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import pytest

from harness.diagnosis.record import Diagnosis
from harness.reports.report import ConformanceFailure

T = TypeVar("T")

HANG = "hang"
STARTUP_FACTOR = 10.0  # first-call start-up allowance per second of measured construction
STARTUP_FLOOR_S = 30.0  # ... never less than this (a construction that was fast from cache)


class EngineHang(Exception):
    """A bounded call did not return within its deadline (plain data: what, how long)."""

    def __init__(self, call: str, seconds: float, work: int) -> None:
        super().__init__(f"{call} did not return within {seconds:.1f} s ({work} tokens of work)")
        self.call, self.seconds, self.work = call, seconds, work


@dataclass(frozen=True)
class CallBudget:
    """Seconds allowed per engine call; see the module docstring for the derivation."""

    scale: float = 1.0
    base_s: float = 60.0
    per_token_s: float = 0.5
    startup_s: float = 600.0
    # the constructor's wall time, for an engine that does all its start-up there (None: the
    # first call carries the fixed `startup_s`)
    measured_startup_s: float | None = None

    @property
    def enabled(self) -> bool:
        return self.scale > 0

    def first_call_startup_s(self) -> float:
        """The start-up allowance of an engine's first call, before the scale."""
        if self.measured_startup_s is None:
            return self.startup_s
        return min(self.startup_s, max(STARTUP_FLOOR_S, STARTUP_FACTOR * self.measured_startup_s))

    def seconds(self, work: int, first: bool) -> float:
        startup = self.first_call_startup_s() if first else 0.0
        return self.scale * (self.base_s + self.per_token_s * work + startup)

    def deadline(self, work: int, first: bool) -> float | None:
        """`seconds`, or None where deadlines are off (scale 0)."""
        return self.seconds(work, first) if self.enabled else None

    def startup(self) -> float:
        return self.scale * self.startup_s


def call_with_deadline(fn: Callable[..., T], args: Sequence[Any], seconds: float | None,
                       call: str, work: int = 0) -> T:
    """fn(*args) in a daemon thread; EngineHang if it has not returned after `seconds`.
    Exceptions of fn are re-raised here, in the caller's thread; Ctrl-C interrupts the wait."""
    if seconds is None:
        return fn(*args)
    box: dict[str, Any] = {}
    finished = threading.Event()

    def run() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as e:  # handed to the waiting thread, never lost
            box["error"] = e
        finally:
            finished.set()

    worker = threading.Thread(target=run, name=f"engine-{call}", daemon=True)
    # short waits: the main thread runs Python between them, so a Ctrl-C that the OS handed
    # to the worker thread is raised here at once, not after the deadline (seen under load:
    # the interrupt of a busy capture came out as a hang). Liveness is the worker's own
    # event, not Thread.is_alive(): a join that Ctrl-C interrupts marks a running thread as
    # stopped (CPython 3.11's bpo-45274 handling), which hid it from _ABANDONED. start() is
    # inside the try: an engine that is interrupted at once (its first op) interrupts start()'s
    # own wait for the thread to run
    end = time.monotonic() + seconds
    try:
        worker.start()
        while not finished.is_set() and time.monotonic() < end:
            finished.wait(min(_POLL_S, max(0.0, end - time.monotonic())))
    except BaseException:
        # Ctrl-C while the engine still works: its thread is abandoned like a hung call's, so
        # the process exits without interpreter shutdown under it (an abort, exit 134, else)
        if not finished.is_set():
            _ABANDONED.append(finished)
        raise
    if not finished.is_set():
        _ABANDONED.append(finished)
        raise EngineHang(call, seconds, work)
    if "error" in box:
        raise box["error"]
    return box["value"]


_POLL_S = 0.2
# workers of calls past their deadline, still in engine code. None may be running while the
# interpreter shuts down: a torch op in a daemon thread at exit aborts the process
# ("terminate called without an active exception", exit -6, seen with zoo:capture_hangs once
# close() released its blocked forward), so the session waits for them (`join_abandoned`)
_ABANDONED: list[threading.Event] = []  # each set when its call's worker has left engine code


def join_abandoned(seconds: float) -> int:
    """Wait up to `seconds` in all for the workers of hung calls to end (closing a hung
    engine releases them); how many are still running."""
    end = time.monotonic() + seconds
    for finished in list(_ABANDONED):
        finished.wait(max(0.0, end - time.monotonic()))
    _ABANDONED[:] = [f for f in _ABANDONED if not f.is_set()]
    return len(_ABANDONED)


def hang_diagnosis(engine_name: str, hang: EngineHang) -> Diagnosis:
    return Diagnosis(
        kind=HANG, message=(
            f"engine {engine_name}: {hang}; root cause: hang — the engine stopped making "
            f"progress (a deadlock, a scheduler waiting for work that never comes, a kernel "
            f"spinning). Its remaining checks are skipped. If the machine is merely slow, "
            f"raise --engine-timeout-scale."),
        engine_boundaries=[], training_boundaries=[], suggested_layer_ids=None,
        details={"call": hang.call, "seconds": round(hang.seconds, 3), "work_tokens": hang.work})


def _tokens(prompts: Sequence[Sequence[int]]) -> int:
    return sum(len(p) for p in prompts)


def call_work(method: str, args: Sequence[Any]) -> int:
    prompts = args[0] if args else ()
    if method == "generate":
        new = int(args[1]) if len(args) > 1 else 0
        return _tokens(prompts) + len(prompts) * new * (2 if (len(args) > 2 and args[2]) else 1)
    if method == "decode_inputs":  # a speculative generation, recorded
        new = int(args[1]) if len(args) > 1 else 0
        return _tokens(prompts) + len(prompts) * new * 2
    return _tokens(prompts)


class BoundedCalls:
    """Replaces an engine instance's `capture`, `generate` and `decode_inputs` by bounded
    versions (instance attributes: the class, isinstance and every other attribute stay the
    engine's own). Every protocol call that runs the engine is here: one left out hangs the
    run where the engine does (zoo:capture_hangs hung the decode-input check for good)."""

    METHODS = ("capture", "generate", "decode_inputs")
    ARGS = {"capture": ("prompts",), "generate": ("prompts", "max_new_tokens", "speculative"),
            "decode_inputs": ("prompts", "max_new_tokens")}

    def __init__(self, engine: Any, budget: CallBudget, on_hang: Callable[[str], None]) -> None:
        self.engine, self.budget, self.on_hang = engine, budget, on_hang
        self.first = True
        self.hung: str | None = None
        for method in self.METHODS:
            original = getattr(engine, method)
            setattr(engine, method, self._bounded(method, original))

    def _bounded(self, method: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if self.hung is not None:
                pytest.skip(self.hung)
            if kwargs:  # keyword calls are bound positionally, in protocol order
                names = self.ARGS[method]
                args = (*args, *(kwargs.pop(n) for n in names[len(args):] if n in kwargs))
            work = call_work(method, args)
            seconds = self.budget.deadline(work, self.first)
            self.first = False
            try:
                return call_with_deadline(original, args, seconds, method, work)
            except EngineHang as hang:
                diag = hang_diagnosis(getattr(self.engine, "name", "?"), hang)
                self.hung = f"not run: the engine hung earlier ({hang})"
                self.on_hang(self.hung)
                raise ConformanceFailure(diag.message, [diag]) from None

        return call


def start_engine(factory: Callable[[], T], budget: CallBudget) -> T:
    """The engine's constructor under the start-up bound; EngineHang if it never returns."""
    return call_with_deadline(factory, (), budget.startup() if budget.enabled else None, "start-up")


def start_measured(factory: Callable[[], T], budget: CallBudget,
                   engine_class: type) -> tuple[T, CallBudget]:
    """`start_engine`, and the budget for the engine's calls: with the construction's measured
    time where the class starts up in its constructor (see the module docstring)."""
    started = time.monotonic()
    instance = start_engine(factory, budget)
    if getattr(engine_class, "starts_in_constructor", False):
        return instance, replace(budget, measured_startup_s=time.monotonic() - started)
    own = getattr(instance, "startup_measured_s", None)
    measured = own() if callable(own) else None
    if measured is None:  # a lazy engine that measured nothing: the fixed allowance
        return instance, budget
    return instance, replace(budget, measured_startup_s=float(measured))
