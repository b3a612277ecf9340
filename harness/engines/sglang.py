"""SGLang, served the way a user serves an EAGLE-3 draft: `sglang.Engine(model_path=target,
speculative_algorithm="EAGLE3", speculative_draft_model_path=draft)` in-process (inside a
worker process of its own, `_sglang_worker`), greedy, token-id prompts, the folders untouched.

What it reports is what SGLang did:

- acceptance from each request's own `meta_info` (`spec_verify_ct`, `completion_tokens`,
  and the per-request histogram of accepted drafts per verify step, named
  `spec_correct_drafts_histogram`, with `spec_accept_histogram` its alias up to 0.5.20);
- the fc input through an out-of-tree model package (`SGLANG_EXTERNAL_MODEL_PACKAGE`,
  SGLang's own switch for replacing a model class, registry.py): `_sglang_models` registers
  a subclass of SGLang's `LlamaForCausalLMEagle3` under the same architecture name that
  records what the target handed the draft (`forward_batch.spec_info.hidden_states` at the
  draft model's entry) and the fc output (a hook on `model.fc`, which SGLang skips when the
  width equals the draft's hidden size: then no fc output is reported). The draft's
  weights, config and SGLang's draft code are unchanged; the subclass only observes.

SGLang's EAGLE-3 path needs a CUDA GPU (its CPU backend has no EAGLE): anywhere else, or
without the `sglang` package, the adapter is `EngineUnavailable` and the suite's SGLang
checks skip with that reason. Which layer-id rule SGLang applies depends on the target's
architecture and the SGLang release (`convention_for`); the rules are executed against the
installed releases by tests/test_sglang_conventions.py.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path
from typing import Any, ClassVar

from harness.engines._sglang_protocol import (  # noqa: F401 - the adapter's vocabulary too
    GENERATE_ARGS,
    META_COMPLETION_TOKENS,
    META_HISTOGRAMS,
    META_KEYS,
    META_VERIFY_CT,
    OUTPUT_IDS,
    SAMPLING_KEYS,
    sampling_params,
)
from harness.engines._sglang_worker import WorkerHandle
from harness.engines._worker_engine import WorkerEngine, acceptance_from_histogram
from harness.engines.base import (
    Acceptance,
    EngineOptions,
    EngineUnavailable,
    Generation,
    target_architecture,
)

# Architectures whose SGLang class is DeepseekV2ForCausalLM or a subclass sharing its
# set_eagle3_layers_to_capture (deepseek_v2.py, glm4_moe_lite.py).
DEEPSEEK_ARCHITECTURES = frozenset({
    "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM",
    "Glm4MoeLiteForCausalLM"})
# Architectures with a rule of their own that no convention here models yet.
UNMODELLED_ARCHITECTURES = {
    "GptOssForCausalLM": "gpt_oss.py keeps the ids when their maximum equals N and adds +1 "
                         "otherwise (0.5.23), a rule harness.core.boundaries does not model",
}
# First releases with each change (found by reading every release's source, see
# docs/CONFORMANCE.md): PR #25454's deepseek rule; capture moved into the layer-boundary
# stages, which capture the embedding before layer 0 (deepseek_v2, then llama).
DEEPSEEK_FIRST_ID_RULE = (0, 5, 13)
DEEPSEEK_STAGE_CAPTURE = (0, 5, 21)
LLAMA_STAGE_CAPTURE = (0, 5, 22)
def release(version: str) -> tuple[int, ...]:
    """'0.5.12.post1' -> (0, 5, 12): the release a version string belongs to."""
    parts = []
    for piece in version.split("."):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts)


def convention_for(architecture: str, version: str) -> str:
    """The key of harness.core.boundaries.CONVENTIONS that SGLang `version` applies to a target of
    this architecture. Raises EngineUnavailable for an architecture with an unmodelled rule."""
    if architecture in UNMODELLED_ARCHITECTURES:
        raise EngineUnavailable(f"SGLang's layer-id rule for {architecture} is not modelled: "
                                f"{UNMODELLED_ARCHITECTURES[architecture]}")
    v = release(version)
    if architecture in DEEPSEEK_ARCHITECTURES:
        if v < DEEPSEEK_FIRST_ID_RULE:
            return "sglang"
        return "sglang-deepseek-stages" if v >= DEEPSEEK_STAGE_CAPTURE else "sglang-deepseek"
    return "sglang-stages" if v >= LLAMA_STAGE_CAPTURE else "sglang"


def engine_kwargs(target_dir: Path, draft_dir: Path | None, options: EngineOptions) -> dict[str, Any]:
    """`sglang.Engine` keyword arguments (ServerArgs fields) for the target alone or with the
    draft as a chain of `num_draft_tokens` (topk 1: verify k drafts plus the bonus)."""
    kwargs: dict[str, Any] = dict(
        model_path=str(target_dir), dtype=options.dtype, random_seed=options.seed,
        context_length=options.max_model_len, device="cuda",
        skip_tokenizer_init=True,  # token-id prompts: the folders carry no tokenizer
        disable_radix_cache=True,  # a cached prefix would shrink the prefill that is captured
        disable_cuda_graph=True,  # the capture hooks must see every draft forward; tiny models
        mem_fraction_static=0.3,  # two engines (plain and speculative) share one GPU
        log_level="warning",
    )
    if draft_dir is not None:
        kwargs.update(
            speculative_algorithm="EAGLE3", speculative_draft_model_path=str(draft_dir),
            speculative_num_steps=options.num_draft_tokens, speculative_eagle_topk=1,
            speculative_num_draft_tokens=options.num_draft_tokens + 1)
    return kwargs


def acceptance_from_meta(meta: dict[str, Any], k: int) -> Acceptance:
    """One request's acceptance from its meta_info. SGLang writes the spec keys only once a
    verify step ran; no key then means no drafts, not an unknown count."""
    verify_ct = int(meta.get(META_VERIFY_CT, 0) or 0)
    if verify_ct == 0:
        return Acceptance(accepted_per_pos=[0] * k)
    histogram = next((meta[key] for key in META_HISTOGRAMS if meta.get(key)), None)
    if histogram is None:
        raise RuntimeError(f"SGLang reported {META_VERIFY_CT}={verify_ct} but none of "
                           f"{list(META_HISTOGRAMS)} in meta_info; update the adapter's keys")
    acceptance = acceptance_from_histogram(histogram, verify_ct * k, k)
    if acceptance.num_drafts != verify_ct:
        raise RuntimeError(f"SGLang's acceptance histogram counts {acceptance.num_drafts} "
                           f"verify steps, {META_VERIFY_CT} says {verify_ct}")
    return acceptance


def _sglang_version() -> str | None:
    """Read without importing sglang (seconds, and process-wide CUDA state)."""
    if importlib.util.find_spec("sglang") is None:
        return None
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


class SglangEngine(WorkerEngine):
    name: ClassVar[str] = "sglang"
    label: ClassVar[str] = "SGLang"
    handle_cls: ClassVar[type[WorkerHandle]] = WorkerHandle
    # The newest release's rule for the bundle's DeepSeek-V3 target; an instance replaces it
    # with convention_for(its target's architecture, the installed release): Engine.__init__
    # asks convention_for_target.
    convention: ClassVar[str | None] = "sglang-deepseek-stages"

    @classmethod
    def convention_for_target(cls, target_dir: Path) -> str | None:
        """The installed release's rule for that target's architecture (what an instance
        declares), for the layer-id checks and the doctor; the class's default where SGLang is
        not installed, whose engine then refuses to start and says why."""
        version = _sglang_version()
        if version is None:
            return cls.convention
        return convention_for(target_architecture(target_dir), version)

    def __init__(self, target_dir: Path, draft_dir: Path, options: EngineOptions) -> None:
        super().__init__(target_dir, draft_dir, options)
        version = _sglang_version()
        if version is None:
            raise EngineUnavailable("sglang is not installed (pip install "
                                    "'eagle3-conformance[sglang]' on a CUDA machine)")
        if options.device == "cpu":
            raise EngineUnavailable("SGLang's EAGLE-3 path needs a CUDA GPU (its CPU backend "
                                    "has no EAGLE); run with --device cuda on a GPU machine")
        if _cuda_devices() == 0:
            raise EngineUnavailable("SGLang needs a CUDA GPU and torch sees none here")
        if options.tree_topk > 1:
            raise EngineUnavailable("tree drafting (tree_topk > 1) is not wired in the SGLang "
                                    "adapter; it serves a chain (speculative_eagle_topk=1)")
        self._version = version
        self._plain()  # proves SGLang starts on this machine, or says why not (skip)

    # -- protocol ---------------------------------------------------------------------------

    def version(self) -> str:
        return f"{self._version}+cuda"

    def _generation(self, result: dict[str, Any], k: int) -> Generation:
        """SGLang's per-request `meta_info` acceptance, summed, as a Generation."""
        per_prompt = [acceptance_from_meta(meta, k) for meta in result["meta"]]
        total = sum(per_prompt[1:], per_prompt[0]) if per_prompt else Acceptance(
            accepted_per_pos=[0] * k)
        return Generation(tokens=result["tokens"], acceptance=total, per_prompt_acceptance=per_prompt)

    def info(self) -> dict[str, Any]:
        """The convention this release follows and, once the speculative worker has started,
        what SGLang decided for this draft: the aux layers it set on the target
        (`layers_to_capture`), the draft class, start-up seconds."""
        handle = self._spec_worker.get("spec")
        return {**(handle.info if handle is not None else {}), "convention": self.convention}

    # -- workers --------------------------------------------------------------------------------

    def _spec_for(self, draft: bool, scratch: Path) -> dict[str, Any]:
        capture_dir = scratch / "capture"
        env = {}
        if draft:
            capture_dir.mkdir(parents=True, exist_ok=True)
            env = {"SGLANG_EXTERNAL_MODEL_PACKAGE": "harness.engines._sglang_models",
                   "EAGLE3_SGLANG_CAPTURE_DIR": str(capture_dir)}
        return {
            "engine_args": engine_kwargs(self.target_dir, self.draft_dir if draft else None,
                                         self.options),
            "capture_dir": str(capture_dir) if draft else None,
            "log_path": str(scratch / ("spec.log" if draft else "plain.log")),
            "env": env,
        }
