"""Training-time features of a target, computed in fp32: the ground truth every engine is
compared against. Used by the golden builder for the pinned prompts and by the suites for
prompts Hypothesis draws; the committed tensors pin this code against library drift.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from harness.models.residual import StateRecorder


@dataclass
class TargetFeatures:
    """Per prompt (unpadded). Shapes: boundaries [N+1, T, H]; final_normed [T, H]
    (boundary N after the final norm); mlp_out [N+1, T, H] where mlp_out[k] is layer k-1's
    MLP/MoE output alone (what an engine that keeps the residual apart captures if it
    forgets to add it back; mlp_out[0] is the embedding itself); logits [T, V], or None
    where the features come from a bundle's pinned tensors (they store no logits: ask the
    Oracle's target instead of reading an empty tensor)."""

    boundaries: torch.Tensor
    final_normed: torch.Tensor
    mlp_out: torch.Tensor
    logits: torch.Tensor | None

    @property
    def num_layers(self) -> int:
        return self.boundaries.shape[0] - 1

    def prefix(self, rows: int) -> TargetFeatures:
        """The features of the first `rows` positions (a sequence's prompt part)."""
        return TargetFeatures(boundaries=self.boundaries[:, :rows], final_normed=self.final_normed[:rows],
                              mlp_out=self.mlp_out[:, :rows],
                              logits=None if self.logits is None else self.logits[:rows])


def relative_errors(x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per token (last dim reduced), |x - ref| / |ref| in fp32: the one error measure every
    capture and fc comparison uses. Broadcasts, so x [T, H] against ref [C, T, H] gives [C, T]."""
    ref = ref.float()
    err = (x.float() - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-12)
    # NaN > rtol is False: a NaN error must count as the worst error, never as a match
    return torch.nan_to_num(err, nan=math.inf, posinf=math.inf)


@torch.no_grad()
def target_features(model: torch.nn.Module, prompt: Sequence[int]) -> TargetFeatures:
    """One prompt at a time, unpadded, so no padding convention leaks into the golden data."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt)], dtype=torch.long, device=device)
    recorder = StateRecorder(model)
    recorder.active = True
    try:
        out = model(input_ids=ids, use_cache=False)
        states = recorder.take()
    finally:
        recorder.close()
    return TargetFeatures(boundaries=_row(states.inputs), final_normed=_row([states.final_normed])[0],
                          mlp_out=_row(states.mlp_out), logits=out.logits[0].float().cpu())


def _row(states: Sequence[torch.Tensor]) -> torch.Tensor:
    """The one prompt's [T, H] of each recorded [1, T, H] state, stacked, fp32, on the CPU."""
    return torch.stack([x[0].float().clone() for x in states], 0).cpu()


def aux_features(features: TargetFeatures, boundaries: Sequence[int]) -> torch.Tensor:
    """The training-layout input of fc: cat of the given boundaries in slot order, [T, n*H]."""
    return torch.cat([features.boundaries[b] for b in boundaries], dim=-1)
