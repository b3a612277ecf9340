"""A TEMPLATE for an engine adapter: copy it, replace the engine, keep the shape. It is not a
certified engine and certifies nothing about one.

The "engine" it drives is the harness's own transformers serving path (a transformers target
plus the EAGLE-3 runtime of harness.engines.speculative) treated as a black box, the way your
adapter drives your engine: it loads the two folders as given, reads the layer ids the way
the engine reads them (its own declared convention, defined here, outside the package) and
reaches the draft's fc input by wrapping the engine's fc entry point, as the vLLM adapter
wraps the drafter's `combine_hidden_states` (harness/engines/_vllm_worker.py).
tests/test_adapter_template.py runs the suite against it, so docs/ADAPTERS.md cannot rot.

Run it: eagle3-conformance run --engine examples.template_adapter:TemplateEngine
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
import transformers

# The adapter's whole view of the package: its public API (docs/ADAPTERS.md).
from harness.adapter import (
    IDS,
    Capability,
    Capture,
    Convention,
    Engine,
    EngineCrash,
    EngineOptions,
    EngineUnavailable,
    Generation,
    config_layer_ids,
    ids_to_boundaries,
)

# YOUR ENGINE: these two imports stand for it (the harness's own EAGLE-3 runtime, driven as a
# black box). Replace them with your engine's package.
from harness.engines.speculative import Eagle3Runtime  # noqa: I001
from harness.models.draft import Eagle3Draft

# The engine's own layer-id rule, declared by the adapter without editing the package: id k is
# the output of layer k (boundary k+1) and -1 the embedding. Diagnoses word their fixing id
# lists in it, and report.json names it.
TEMPLATE_CONVENTION = Convention(
    name="template-engine",
    description="template engine: id k = output of layer k (b = k+1), id -1 = the embedding",
    offset=1, embedding_id=-1,
    negative_id_reason="only -1 (the embedding) is a valid negative id",
)


class TemplateEngine(Engine):
    name: ClassVar[str] = "template"
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {Capability.CAPTURE, Capability.FC_PROBE, Capability.GENERATE})
    convention: ClassVar[Convention] = TEMPLATE_CONVENTION
    default_dtype: ClassVar[str] = "float32"

    def __init__(self, target_dir: Path, draft_dir: Path, options: EngineOptions) -> None:
        super().__init__(target_dir, draft_dir, options)
        if options.device != "cpu" and not torch.cuda.is_available():
            raise EngineUnavailable(f"device {options.device} is not available here")
        dtype = getattr(torch, options.dtype)
        # 1. Serve the folders exactly as a user hands them over: no conversion, no id rewrite.
        target = transformers.AutoModelForCausalLM.from_pretrained(str(self.target_dir), dtype=dtype)
        target = target.to(options.device).eval()
        draft = Eagle3Draft.load(self.draft_dir, dtype, options.device)
        # 2. Read the ids where the engine reads them, in the engine's own rule.
        #    SpecForge nests the ids under eagle_config, speculators writes them at the top
        #    level: a draft comes in either layout.
        ids = config_layer_ids(self.draft_dir)
        if ids is None:
            raise EngineCrash(f"template engine found no {IDS} in the draft config")
        try:
            boundaries = ids_to_boundaries(ids, self.convention, target.config.num_hidden_layers)
        except ValueError as e:  # the engine refuses the draft: a conformance failure
            raise EngineCrash(f"template engine refused the draft's ids: {e}") from None
        self._engine = Eagle3Runtime(target, draft, boundaries)
        # 3. Reach the fc input where the engine computes it: wrap its fc entry point once and
        #    record while `capture` runs (vLLM: the drafter's combine_hidden_states).
        self._records: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        draft.project = self._recording(draft.project)

    def _recording(self, fc: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
        def project(aux: torch.Tensor) -> torch.Tensor:
            out = fc(aux)
            if self._records is not None:
                self._records.append((aux.detach().float().cpu(), out.detach().float().cpu()))
            return out
        return project

    def version(self) -> str:
        return f"template adapter over transformers {transformers.__version__}"

    def capture(self, prompts: Sequence[Sequence[int]]) -> Capture:
        """One prompt per engine call, one new token: the first fc call is that prompt's
        prefill, one row per prompt token (no batch to split back)."""
        features, fc_out = [], []
        for prompt in prompts:
            self._records = []
            try:
                self._engine.speculative(list(prompt), 1, self.options.num_draft_tokens)
                (aux, out), *_ = self._records
            finally:
                self._records = None
            features.append(aux[0])
            fc_out.append(out[0])
        return Capture(features=features, fc_out=fc_out)

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 speculative: bool) -> Generation:
        if not speculative:
            return Generation(tokens=[self._engine.greedy(list(p), max_new_tokens) for p in prompts])
        k = self.options.num_draft_tokens
        runs = [self._engine.speculative(list(p), max_new_tokens, k) for p in prompts]
        per_prompt = [r.acceptance(k) for r in runs]
        total = sum(per_prompt[1:], per_prompt[0])
        # traces and proposed are optional: leave them None if your engine cannot tell
        return Generation(tokens=[r.tokens for r in runs], acceptance=total,
                          per_prompt_acceptance=per_prompt, traces=[r.trace for r in runs],
                          proposed=[r.proposed for r in runs])

    def info(self) -> dict[str, Any]:
        return {"convention": self.convention.name, "boundaries": list(self._engine.boundaries)}

    def close(self) -> None:
        self._engine.close_runtime()
