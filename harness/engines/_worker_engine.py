"""An `Engine` served from worker processes (`harness.engines._worker`): what the vLLM and
SGLang adapters share, so each adapter holds only what its engine does differently (how a
worker is started and what its ops return).

Two workers per adapter: a target-only one, shared by every engine of the session with the
same target and options (start-up costs seconds and does not depend on the draft), and a
speculative one per draft. A draft that crashes the engine usually crashes it on every call
(an id matching no layer); a fresh worker per call would cost a start-up per Hypothesis
example, so the same failure twice in a row (numbers aside), or any start-up failure with the
draft, is final for that draft.
"""

from __future__ import annotations

import abc
import atexit
import re
import shutil
import tempfile
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from safetensors.torch import load_file

from harness.engines._worker import WorkerError, WorkerHandle
from harness.engines.base import (
    Acceptance,
    Capability,
    Capture,
    Engine,
    EngineCrash,
    EngineOptions,
    EngineUnavailable,
    Generation,
)


class WorkerEngine(Engine):
    """Subclasses set `handle_cls` and `label` and build a worker's spec in `_spec_for`; the
    spec must carry `log_path` and `env` (defaults a user's own variable overrides)."""

    handle_cls: ClassVar[type[WorkerHandle]]
    label: ClassVar[str]
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {Capability.CAPTURE, Capability.FC_PROBE, Capability.GENERATE, Capability.THROUGHPUT})
    default_dtype: ClassVar[str] = "bfloat16"  # how these engines are served in production
    _shared_plain: ClassVar[dict[tuple[Any, ...], WorkerHandle]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._shared_plain = {}
        atexit.register(cls.stop_shared)

    def __init__(self, target_dir: Path, draft_dir: Path, options: EngineOptions) -> None:
        super().__init__(target_dir, draft_dir, options)
        self._scratch = Path(tempfile.mkdtemp(prefix=f"eagle3-{self.name}-"))
        self._spec_worker: dict[str, WorkerHandle] = {}
        self._last_failure: str | None = None
        self._final_failure: str | None = None
        self._finalizer = weakref.finalize(self, _release, self._spec_worker, self._scratch)

    @classmethod
    def stop_shared(cls) -> None:
        """Stop the shared target-only workers (also run at exit); the next engine starts anew."""
        for handle in cls._shared_plain.values():
            handle.stop()
            shutil.rmtree(handle.log_path.parent, ignore_errors=True)
        cls._shared_plain.clear()

    @abc.abstractmethod
    def _spec_for(self, draft: bool, scratch: Path) -> dict[str, Any]:
        """The worker's start-up spec: with the draft (speculative) or the target alone."""

    # -- protocol ---------------------------------------------------------------------------

    def capture(self, prompts: Sequence[Sequence[int]]) -> Capture:
        out = self._scratch / "capture.safetensors"
        try:
            self._call_spec("capture", [list(p) for p in prompts], str(out))
            return read_capture(out)
        finally:
            out.unlink(missing_ok=True)

    def close(self) -> None:
        self._finalizer()

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 speculative: bool) -> Generation:
        """Plain decoding in the plain worker; speculative in the draft's worker, whose
        result each adapter reads into a Generation (`_generation`)."""
        if not speculative:
            return self._generate_plain(prompts, max_new_tokens)
        result = self._call_spec("generate", [list(p) for p in prompts], max_new_tokens)
        return self._generation(result, self.options.num_draft_tokens)

    def _generation(self, result: dict[str, Any], k: int) -> Generation:
        """The speculative worker's `generate` result as a Generation (acceptance counters
        in the engine's own format)."""
        raise NotImplementedError

    def _generate_plain(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> Generation:
        """Greedy generation by the shared target-only worker (its op returns `tokens`)."""
        return Generation(tokens=self._call(self._plain(), "generate", [list(p) for p in prompts],
                                            max_new_tokens)["tokens"])

    def startup_measured_s(self) -> float | None:
        """The target-only worker's start (in the constructor, or earlier in the session for
        a shared one): the draft's worker, started by the first speculative call, is the same
        engine starting with a draft on top."""
        handle = self._shared_plain.get(self._plain_key())
        return None if handle is None else handle.startup_s

    # -- workers --------------------------------------------------------------------------------

    def _plain_key(self) -> tuple[Any, ...]:
        return (str(self.target_dir.resolve()), self.options.dtype, self.options.device,
                self.options.seed, self.options.max_model_len)

    def _plain(self) -> WorkerHandle:
        key = self._plain_key()
        handle = self._shared_plain.get(key)
        if handle is None or not handle.alive:
            scratch = Path(tempfile.mkdtemp(prefix=f"eagle3-{self.name}-plain-"))
            try:
                handle = self.handle_cls(self._spec_for(False, scratch))
            except WorkerError as e:
                raise EngineUnavailable(f"{self.label} cannot serve the target here: {e}") from None
            self._shared_plain[key] = handle
        return handle

    def _spec(self) -> WorkerHandle:
        handle = self._spec_worker.get("spec")
        if handle is None or not handle.alive:
            try:
                handle = self.handle_cls(self._spec_for(True, self._scratch))
            except WorkerError as e:
                # the target alone starts (checked in __init__), so this is the draft's doing
                self._final_failure = f"{self.label} could not start with this EAGLE-3 draft: {e}"
                raise EngineCrash(self._final_failure) from None
            self._spec_worker["spec"] = handle
        return handle

    def _call_spec(self, op: str, *args: Any) -> Any:
        if self._final_failure:
            raise EngineCrash(f"{self._final_failure} (the same failure as before; the "
                              f"worker is not restarted for this draft again)")
        try:
            result = self._call(self._spec(), op, *args)
        except EngineCrash as crash:
            cause = re.sub(r"\d+", "#", str(crash).split(": ", 1)[-1])
            if cause == self._last_failure:
                self._final_failure = str(crash)
            self._last_failure = cause
            raise
        self._last_failure = None
        return result

    def _call(self, handle: WorkerHandle, op: str, *args: Any) -> Any:
        """One op; a worker failure becomes an EngineCrash (plain data: the suite, which holds
        the draft's spec, diagnoses it)."""
        try:
            return handle.call(op, *args)
        except WorkerError as e:
            raise EngineCrash(f"{self.label} failed during {op}: {e}") from None


def read_capture(path: Path) -> Capture:
    """fc_out only where every prompt has it (a crashed capture has features alone)."""
    tensors = load_file(str(path))
    count = sum(1 for name in tensors if name.startswith("features."))
    features = [tensors[f"features.{i}"] for i in range(count)]
    fc_out = [tensors[f"fc_out.{i}"] for i in range(count) if f"fc_out.{i}" in tensors]
    return Capture(features=features, fc_out=fc_out if len(fc_out) == count else None)


def acceptance_from_histogram(histogram: Sequence[int], num_draft_tokens: int, k: int) -> Acceptance:
    """A per-request histogram (entry j: verify steps that accepted j drafts; vLLM's
    `histogram`, SGLang's `spec_correct_drafts_histogram`) in counter form: a chain accepting
    j drafts accepted every position below j."""
    hist = list(histogram)
    return Acceptance(
        num_drafts=sum(hist), num_draft_tokens=num_draft_tokens,
        num_accepted_tokens=sum(j * n for j, n in enumerate(hist)),
        accepted_per_pos=[sum(n for j, n in enumerate(hist) if j > p) for p in range(k)])


def _release(workers: dict[str, WorkerHandle], scratch: Path) -> None:
    for handle in workers.values():
        handle.stop()
    workers.clear()
    shutil.rmtree(scratch, ignore_errors=True)
