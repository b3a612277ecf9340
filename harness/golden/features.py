"""Training-time features of a target, computed in fp32: the ground truth every engine is
compared against. Used by the golden builder for the pinned prompts and by the suites for
prompts Hypothesis draws; the committed tensors pin this code against library drift.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from harness.models.target import decoder_layers


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


@torch.no_grad()
def target_features(model: torch.nn.Module, prompt: Sequence[int]) -> TargetFeatures:
    """One prompt at a time, unpadded, so no padding convention leaks into the golden data."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt)], dtype=torch.long, device=device)
    layers = decoder_layers(model)
    inputs: list[torch.Tensor] = []
    mlps: list[torch.Tensor] = []
    handles = []
    for layer in layers:
        handles.append(layer.register_forward_pre_hook(
            lambda _m, args, kwargs: inputs.append(
                (args[0] if args else kwargs["hidden_states"])[0].float().clone()),
            with_kwargs=True))
        handles.append(layer.mlp.register_forward_hook(
            lambda _m, _a, out: mlps.append((out[0] if isinstance(out, tuple) else out)[0].float().clone())))
    norm = model.model.norm
    handles.append(norm.register_forward_pre_hook(lambda _m, args: inputs.append(args[0][0].float().clone())))
    normed: list[torch.Tensor] = []
    handles.append(norm.register_forward_hook(lambda _m, _a, out: normed.append(out[0].float().clone())))
    try:
        out = model(input_ids=ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    boundaries = torch.stack(inputs, 0).cpu()
    mlp_out = torch.stack([boundaries[0]] + [m.cpu() for m in mlps], 0)
    return TargetFeatures(boundaries=boundaries, final_normed=normed[0].cpu(),
                          mlp_out=mlp_out, logits=out.logits[0].float().cpu())


def aux_features(features: TargetFeatures, boundaries: Sequence[int]) -> torch.Tensor:
    """The training-layout input of fc: cat of the given boundaries in slot order, [T, n*H]."""
    return torch.cat([features.boundaries[b] for b in boundaries], dim=-1)
