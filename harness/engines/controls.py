"""Real engines wired right: the non-circular controls of the reduced-precision judgement.

A control must be a different implementation from the one that set the bound (issue #30):
the reference engine judged against its own bf16 computation passes by construction and says
nothing about the engines users point the suite at. vLLM is a different implementation (its
own attention, fused MoE, fused add-RMSNorm, its CPU GEMMs) that serves bf16; wired as the
draft was trained, every capture, fc, batch-invariance and decode check that fails on it is a
false alarm of the suite.

`VllmWiredAsTrained` is the real vLLM adapter (`harness.engines.vllm.VllmEngine`, nothing
mocked) served a copy of the draft whose config ids are rewritten so that vLLM's own rule for the
target's architecture (`VllmEngine.convention_for_target`: b = id on both, boundary 0 crashing
on DeepSeek's model and captured on the EagleModelMixin models, Qwen3-MoE among them) names
exactly the training boundaries: what a user who read this suite's diagnosis would deploy. It
honours the draft's training convention like the reference engine does, so the layer-id checks
judge it the same way. A draft whose training boundaries vLLM cannot express on that target
(the embedding on a DeepSeek target) is unavailable, with vLLM's reason.

    eagle3-conformance run --engine harness.engines.controls:VllmWiredAsTrained \
        --dtype bfloat16 --profile nightly --draft specforge-default --draft single-aux \
        --draft final-aux
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, ClassVar

from harness.core.boundaries import LayerIdError, boundaries_to_ids, ids_to_boundaries
from harness.core.config_schema import IDS
from harness.engines.base import ConfigInexpressible, EngineOptions
from harness.engines.vllm import VllmEngine


def _training_convention(ids: list[int], options: EngineOptions) -> str:
    """The convention training meant the ids in: the bundle's record where the suite passes it
    (EngineOptions.training_convention), else the reference engine's default reading."""
    if options.training_convention:
        return options.training_convention
    return "embedding-minus-one" if -1 in ids else "specforge"


def rewrite_for_vllm(draft_dir: Path, target_dir: Path, options: EngineOptions,
                     into: Path) -> tuple[list[int], list[int]]:
    """Copy the draft into `into` with its ids rewritten to vLLM's ids for the same training
    boundaries, under vLLM's rule for this target's architecture (a DeepSeek target's id 0
    crashes, a Qwen3-MoE target's captures the embedding: the rule is the adapter's, so the
    control and the suite's layer-id checks cannot disagree about it); returns (the config's ids,
    vLLM's ids). ConfigInexpressible where vLLM has no id list for those boundaries
    (EngineUnavailable: it serves other drafts), EngineUnavailable where it has no
    modelled rule for the architecture."""
    config = json.loads((draft_dir / "config.json").read_text(encoding="utf-8"))
    layers = int(json.loads((target_dir / "config.json").read_text(encoding="utf-8"))["num_hidden_layers"])
    nested = config.get("eagle_config") or {}
    ids = list(nested.get(IDS, config.get(IDS)) or [])
    convention = _training_convention(ids, options)
    vllm_rule = VllmEngine.convention_for_target(target_dir)
    try:
        trained = ids_to_boundaries(ids, convention, layers)
        served = list(boundaries_to_ids(trained, vllm_rule, layers))
    except LayerIdError as e:
        raise ConfigInexpressible(f"vLLM ({vllm_rule} rule) cannot be wired as this draft was "
                                  f"trained (ids {ids} read as {convention}): {e}") from None
    shutil.copytree(draft_dir, into)
    if IDS in nested:
        nested[IDS] = served
    else:
        config[IDS] = served
    (into / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return ids, served


class VllmWiredAsTrained(VllmEngine):
    """Real vLLM, its draft's ids rewritten to mean the training boundaries under vLLM's rule."""

    name: ClassVar[str] = "vllm-wired-as-trained"
    label: ClassVar[str] = "vLLM (ids rewritten to the training boundaries)"
    convention: ClassVar[str | None] = None  # honours the draft's training convention

    @classmethod
    def convention_for_target(cls, target_dir: Path) -> str | None:
        """None on every target: the control honours the training convention it is told (the
        ids are rewritten for vLLM's rule inside), as the reference does. Inheriting vLLM's
        per-architecture rule made the suite withhold the convention from it, and the control
        read every drawn draft's ids as SpecForge's and was misfed (found on tiny-qwen3moe)."""
        return None

    def __init__(self, target_dir: Path, draft_dir: Path, options: EngineOptions) -> None:
        self._scratch = Path(tempfile.mkdtemp(prefix="vllm-wired-"))
        try:
            self.config_ids, self.served_ids = rewrite_for_vllm(
                Path(draft_dir), Path(target_dir), options, self._scratch / "draft")
            super().__init__(target_dir, self._scratch / "draft", options)
        except BaseException:
            shutil.rmtree(self._scratch, ignore_errors=True)
            raise

    def info(self) -> dict[str, Any]:
        return {**super().info(), "config_ids": self.config_ids, "served_ids": self.served_ids}

    def close(self) -> None:
        try:
            super().close()
        finally:
            shutil.rmtree(self._scratch, ignore_errors=True)
