"""The one residual-stream recorder: forward hooks on a target's decoder layers and final norm
that keep every boundary of the latest forward (and the states engines hand over by
mistake). The golden builder and the oracle read training-time features through it, the
speculative runtime reads what it hands the draft through it, so "boundary b" means the same
tensor everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.models.placement import gathered
from harness.models.target import decoder_layers


@dataclass
class TargetStates:
    """Everything one target forward exposes to a capture rule, each [B, T, H].

    inputs[b]: boundary b (input of layer b; b = N is the input of the final norm).
    mlp_out[b]: layer b-1's MLP/MoE output alone, without the residual (mlp_out[0] is the
    embedding). final_normed: boundary N after the final norm.
    """

    inputs: list[torch.Tensor]
    mlp_out: list[torch.Tensor]
    final_normed: torch.Tensor


class StateRecorder:
    """Forward hooks that keep the residual stream of the latest target forward.

    Pre-hooks on the decoder layers and the final norm rather than `output_hidden_states`:
    transformers 5.19 returns boundary N after the final norm there. Under a tensor-parallel
    placement (harness/models/placement.py) a state the plan leaves sharded (a DTensor) is
    all-gathered before it is kept, so a boundary is always the whole residual stream; with
    transformers' DeepSeek-V3 plan none is (row-parallel outputs are all-reduced inside the
    layer), which tests/test_distributed_placement.py checks on two processes.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        layers = decoder_layers(model)
        self.num_layers = len(layers)
        self.active = False
        self._inputs: dict[int, torch.Tensor] = {}
        self._mlp: dict[int, torch.Tensor] = {}
        self._normed: torch.Tensor | None = None
        self._handles = []
        for i, layer in enumerate(layers):
            self._handles.append(layer.register_forward_pre_hook(self._on_input(i), with_kwargs=True))
            self._handles.append(layer.mlp.register_forward_hook(self._on_mlp(i + 1)))
        norm = model.model.norm
        self._handles.append(norm.register_forward_pre_hook(self._on_input(self.num_layers),
                                                            with_kwargs=True))
        self._handles.append(norm.register_forward_hook(self._on_normed))

    def _on_input(self, b: int):
        def hook(_module, args, kwargs):
            if self.active:
                self._inputs[b] = gathered(args[0] if args else kwargs["hidden_states"]).detach()
        return hook

    def _on_mlp(self, b: int):
        def hook(_module, _args, out):
            if self.active:
                self._mlp[b] = gathered(out[0] if isinstance(out, tuple) else out).detach()
        return hook

    def _on_normed(self, _module, _args, out) -> None:
        if self.active:
            self._normed = gathered(out[0] if isinstance(out, tuple) else out).detach()

    def take(self) -> TargetStates:
        n = self.num_layers
        if len(self._inputs) != n + 1 or len(self._mlp) != n or self._normed is None:
            raise RuntimeError("the target forward did not pass through every decoder layer and "
                               "the final norm; the recorder cannot see its residual stream")
        inputs = [self._inputs[b] for b in range(n + 1)]
        states = TargetStates(inputs, [inputs[0]] + [self._mlp[b] for b in range(1, n + 1)],
                              self._normed)
        self._inputs, self._mlp, self._normed = {}, {}, None
        return states

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
