"""The reference engine: the draft served exactly as it was trained, on HF transformers.

It is the suite's control: every check must pass on it, and each bug-zoo mutant
(`harness.engines.zoo`) is a subclass that overrides one wiring hook of
`harness.engines.speculative.Eagle3Runtime` to reproduce one real engine's bug. The hooks,
and what a mutant changes in each, are documented there; this module adds only loading,
the training convention of the draft's layer ids, and the `Engine` protocol.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import torch
import transformers

from harness.core.boundaries import ids_to_boundaries
from harness.core.throughput import StepCosts
from harness.core.tolerances import DTYPES
from harness.engines.base import (
    Acceptance,
    Capability,
    Capture,
    DecodeInputs,
    DraftFeed,
    Engine,
    EngineCrash,
    EngineOptions,
    EngineUnavailable,
    Generation,
)
from harness.engines.speculative import Eagle3Runtime
from harness.engines.step_costs import measure_step_costs
from harness.models.draft import Eagle3Draft
from harness.models.target import ARCHITECTURES, load_target
from harness.models.variants import apply_choices, load_implementation
from harness.models.variants import implementation as variant


def load_any_target(path: Path, dtype: torch.dtype, device: str,
                    placement: str | None = None) -> torch.nn.Module:
    """A golden target architecture (DeepSeek-V3, Qwen3-MoE: harness.models.target's
    ARCHITECTURES) through the harness loader, with its own class; any other HF causal LM
    (Llama, Qwen, ...) through AutoModelForCausalLM; either spread over the processes of a
    torchrun launch by transformers' tensor parallelism where `placement` says so."""
    config = json.loads((Path(path) / "config.json").read_text())
    golden = {a.model_type for a in ARCHITECTURES.values()}
    if config.get("model_type") in golden or placement is not None:
        return load_target(path, dtype, device, placement)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    return model.to(device).eval()


def default_training_convention(layer_ids: Sequence[int]) -> str:
    """SpecForge's convention unless the ids name the embedding as -1, which SpecForge
    rejects and the "-1 = embedding" pipelines use; both read id k >= 0 as boundary k+1."""
    return "embedding-minus-one" if -1 in layer_ids else "specforge"


@contextmanager
def _failures_as_crashes() -> Iterator[None]:
    """An error of the in-process runtime serving the draft (torch's shape error where fc gets
    fewer slots than it was built for) is an engine crash, as it is out of process: raised as
    EngineCrash, the suite diagnoses it from its text like any engine's, instead of failing
    the check with a bare RuntimeError and no diagnosis."""
    try:
        yield
    except (EngineCrash, EngineUnavailable):
        raise
    except RuntimeError as e:
        raise EngineCrash(f"{type(e).__name__}: {e}") from e


class ReferenceEngine(Eagle3Runtime, Engine):
    """Serves the draft as trained: ids read in the training convention, boundaries captured
    pre-norm with the residual, slots in config order, fc once, chain or tree drafting."""

    name = "reference"
    capabilities = frozenset({Capability.CAPTURE, Capability.FC_PROBE, Capability.GENERATE,
                              Capability.THROUGHPUT, Capability.DECODE_INPUTS})
    convention = None  # honours the draft's training convention
    starts_in_constructor = True  # both models load in __init__; calls only run them
    capture_batch_size = 8
    padding_side = "right"

    def __init__(self, target_dir: Path, draft_dir: Path,
                 options: EngineOptions | None = None, implementation: str | None = None) -> None:
        """`implementation`: run the target as one of the precision envelope's other correct
        implementations (a name of harness.models.variants.IMPLEMENTATIONS) instead of
        transformers' defaults: the leave-one-out control (benchmarks/false_alarms.py) judges
        such an engine against the envelope of the others."""
        options = options or EngineOptions()
        Engine.__init__(self, target_dir, draft_dir, options)
        if options.dtype not in DTYPES:
            raise ValueError(f"dtype {options.dtype!r} is not one of {', '.join(DTYPES)}")
        dtype = getattr(torch, options.dtype)
        draft = Eagle3Draft.load(self.draft_dir, dtype, options.device)
        if implementation is None:
            target = load_any_target(self.target_dir, dtype, options.device, options.placement)
        else:
            impl = replace(variant(implementation), device=options.device)
            target = load_implementation(self.target_dir, dtype, impl)
            apply_choices(draft, impl, dtype)
        self.implementation = implementation
        Eagle3Runtime.__init__(self, target, draft)

    def version(self) -> str:
        return f"harness reference (transformers {transformers.__version__}, torch {torch.__version__})"

    @property
    def layer_ids(self) -> tuple[int, ...]:
        """The ids as written in the draft's config."""
        return tuple(self.draft.cfg.aux_layer_ids)

    @property
    def training_convention(self) -> str:
        return self.options.training_convention or default_training_convention(self.layer_ids)

    def capture_boundaries(self) -> Sequence[int]:
        """The config's ids read as training meant them."""
        return ids_to_boundaries(self.layer_ids, self.training_convention, self.num_layers)

    def capture(self, prompts: Sequence[Sequence[int]]) -> Capture:
        features: list[torch.Tensor] = []
        fc_out: list[torch.Tensor] = []
        with _failures_as_crashes():
            for start in range(0, len(prompts), self.capture_batch_size):
                f, o = self.capture_prompts(prompts[start:start + self.capture_batch_size],
                                            self.padding_side)
                features.extend(f)
                fc_out.extend(o)
        return Capture(features=features, fc_out=fc_out)

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 speculative: bool) -> Generation:
        """Prompt by prompt (batch-invariant by construction); speculative runs report
        vLLM-style acceptance, per prompt too, with the per-round traces."""
        with _failures_as_crashes():
            return self._generate(prompts, max_new_tokens, speculative)

    def _generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                  speculative: bool) -> Generation:
        if not speculative:
            return Generation(tokens=[self.greedy(p, max_new_tokens) for p in prompts])
        k, topk = self.options.num_draft_tokens, self.options.tree_topk
        results = [self.speculative(p, max_new_tokens, k, topk) for p in prompts]
        per_prompt = [r.acceptance(k) for r in results]
        total = sum(per_prompt, Acceptance(accepted_per_pos=[0] * k))
        return Generation(tokens=[r.tokens for r in results], acceptance=total,
                          per_prompt_acceptance=per_prompt, traces=[r.trace for r in results],
                          proposed=[r.proposed for r in results])

    def decode_inputs(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> DecodeInputs:
        """Prompt by prompt, the speculative run with every draft feed recorded where
        `Eagle3Runtime._draft_feed` hands it to the draft (after the wiring hooks)."""
        k, topk = self.options.num_draft_tokens, self.options.tree_topk
        tokens: list[list[int]] = []
        feeds: list[list[DraftFeed]] = []
        for prompt in prompts:
            self.feeds = []
            try:
                with _failures_as_crashes():
                    tokens.append(self.speculative(prompt, max_new_tokens, k, topk).tokens)
                feeds.append(self.feeds)
            finally:
                self.feeds = None
        return DecodeInputs(tokens=tokens, feeds=feeds)

    def step_costs(self, prompt: Sequence[int], acceptance_length: float) -> StepCosts:
        return measure_step_costs(self, prompt, self.options.num_draft_tokens, acceptance_length)

    def close(self) -> None:
        self.close_runtime()
