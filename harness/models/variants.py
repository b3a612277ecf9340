"""Correct implementations of the target computation in reduced precision, other than the one
transformers runs by default: the members of the precision envelope (harness/golden/envelope.py).

Why: in bf16 or fp16 no two correct engines compute the same numbers. vLLM, SGLang,
TensorRT-LLM and llama.cpp differ from transformers in the choices below, each a legitimate
implementation of the same model; an engine's error against the fp32 training computation is
only judged fairly against the spread such choices produce, never against one of them (which,
for the reference engine, is the engine itself). Each option reproduces one choice a
production kernel makes (docs/DESIGN.md, "The precision envelope", says which engine makes it):

- `attention`: transformers' own attention kernels, "sdpa" (its default, a fused kernel) or
  "eager" (matmul, fp32 softmax, matmul): other reduction orders in the attention scores.
- `experts`: transformers' own MoE expert kernels, "grouped_mm" (its default), "batched_mm"
  or "eager" (a loop over experts adding each expert's rounded output in expert order):
  other expert-summation orders, the one place MoE engines differ most.
- `norm`: RMSNorm's variance in "fp32" (transformers; vLLM's and SGLang's fused kernels
  accumulate in fp32 too) or in the "dtype" (an unfused kernel accumulating in bf16).
- `residual`: the residual stream kept in the "dtype" between sublayers (transformers) or in
  "fp32" (engines whose fused add-norm keeps a wider residual).
- `gate`: router logits in "fp32" (transformers) or in the "dtype" (vLLM's and SGLang's
  DeepSeek gate is a plain linear layer in the model's dtype; the top-k runs on its output).
  DeepSeek's router only: transformers' Qwen3-MoE router already computes its logits in the
  dtype (a plain linear layer, softmax in fp32), so on that target the member is the default.
- `matmul`: linear layers as one GEMM ("plain") or "splitk" / "splitk8": the reduction
  dimension split in four (eight), each partial rounded to the dtype and summed in the dtype, which is what
  a split-K GEMM with reduced-precision reduction does (PyTorch allows exactly that on CUDA
  by default: `torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction`).
- `device`: "cpu" or "cuda" (cuBLAS and CPU GEMMs round differently).

No option changes what is computed, only how it is rounded: in fp32 every implementation
agrees with the reference to summation order (checked by tests/test_envelope.py).
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM

from harness.models.target import decoder_layers, grouped_topk, moe_routers, router_rule

SPLITK_PARTS = 4


@dataclass(frozen=True)
class Implementation:
    """One correct way to run the target in a reduced dtype (see the module docstring)."""

    name: str
    attention: str = "sdpa"
    experts: str = "grouped_mm"
    norm: str = "fp32"
    residual: str = "dtype"
    gate: str = "fp32"
    matmul: str = "plain"
    device: str = "cpu"

    def on(self, device: str) -> Implementation:
        """The same choices on another device, named for it."""
        if device == self.device:
            return self
        return replace(self, name=f"{self.name}@{device}", device=device)

    def describe(self) -> str:
        default = Implementation(name="")
        changed = [f"{k}={v}" for k, v in asdict(self).items()
                   if k != "name" and v != getattr(default, k)]
        return ", ".join(changed) or "transformers' defaults"


# The transformers default (what the reference engine runs) first; then one member per choice
# a production kernel makes differently; then the composite that makes every lossy choice at
# once (an engine combines several: its error can be their sum, which no single-choice member
# shows). Each member is cheap on the tiny target (one forward per prompt, cached).
REFERENCE = Implementation(name="transformers")
IMPLEMENTATIONS: tuple[Implementation, ...] = (
    REFERENCE,
    Implementation(name="eager-attention", attention="eager"),
    Implementation(name="experts-in-order", experts="eager"),
    Implementation(name="experts-batched", experts="batched_mm"),
    Implementation(name="norm-in-dtype", norm="dtype"),
    Implementation(name="residual-fp32", residual="fp32"),
    Implementation(name="gate-in-dtype", gate="dtype"),
    Implementation(name="splitk-reduction", matmul="splitk"),
    Implementation(name="all-reduced", attention="eager", experts="eager", norm="dtype",
                   gate="dtype", matmul="splitk"),
    # a second composite of other lossy choices: a real engine combines several choices, and
    # one composite alone would leave an engine that combines differently (or the composite
    # itself, left out) outside the envelope of single choices
    Implementation(name="fused-reduced", experts="batched_mm", norm="dtype", gate="dtype",
                   matmul="splitk8"),
)
# Members re-run on a GPU where one is present (the two ends: defaults and all-reduced).
DEVICE_MEMBERS = ("transformers", "all-reduced", "fused-reduced")
# The choices that touch the draft's fc (a linear layer after optional RMSNorms): its envelope.
FC_MEMBERS = ("transformers", "norm-in-dtype", "splitk-reduction", "all-reduced", "fused-reduced")


def experts_kernels() -> set[str]:
    """The MoE expert kernels this transformers offers ("eager" always: the class's own loop);
    an older transformers without the experts interface offers only that one."""
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    except ImportError:
        return {"eager"}
    return {"eager", *ALL_EXPERTS_FUNCTIONS.keys()}


def available(impl: Implementation) -> bool:
    """Whether this machine can run `impl`: its expert kernel exists in this transformers and
    its device is present. A member that cannot run is left out of the envelope (the envelope
    records which members it holds)."""
    if impl.device.startswith("cuda") and not torch.cuda.is_available():
        return False
    default = Implementation(name="")
    return impl.experts == default.experts and impl.experts not in experts_kernels() \
        or impl.experts in experts_kernels()


def implementation(name: str) -> Implementation:
    """The member called `name` ('<name>@cuda' for its GPU twin); KeyError lists the names."""
    base, _, device = name.partition("@")
    for impl in IMPLEMENTATIONS:
        if impl.name == base:
            return impl.on(device) if device else impl
    raise KeyError(f"no implementation {name!r}; known: "
                   f"{', '.join(i.name for i in IMPLEMENTATIONS)} (add @cuda for the GPU)")


def load_implementation(path: str | Path, dtype: torch.dtype, impl: Implementation) -> torch.nn.Module:
    """The target at `path` in `dtype`, computed the way `impl` says."""
    config = AutoConfig.from_pretrained(str(path))
    moe = any(getattr(config, k, None) for k in ("n_routed_experts", "num_local_experts", "num_experts"))
    kwargs = {"experts_implementation": impl.experts} if moe and len(experts_kernels()) > 1 else {}
    model = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=dtype, attn_implementation=impl.attention, **kwargs)
    model = model.to(impl.device).eval()
    if dtype != torch.float32:
        apply_choices(model, impl, dtype)
    return model


def apply_choices(model: torch.nn.Module, impl: Implementation, dtype: torch.dtype) -> None:
    """Make `model` (the target, or the draft for the fc's envelope) round the way `impl`
    says: norms, router, linear layers by module type; the residual stream on decoder layers."""
    for module in model.modules():
        kind = type(module).__name__
        if impl.norm == "dtype" and kind.endswith("RMSNorm"):
            module.forward = types.MethodType(_norm_in_dtype, module)
        if impl.gate == "dtype" and kind.endswith("TopkRouter"):
            module.forward = types.MethodType(_gate_in_dtype, module)
        if impl.matmul.startswith("splitk") and isinstance(module, torch.nn.Linear):
            module.splitk_parts = int(impl.matmul.removeprefix("splitk") or SPLITK_PARTS)
            module.forward = types.MethodType(_splitk_linear, module)
    if impl.residual == "fp32" and hasattr(model, "model"):
        for layer in decoder_layers(model):
            layer.forward = types.MethodType(_fp32_residual_layer, layer)
        final = model.model.norm
        inner = final.forward
        final.forward = lambda hidden_states, _f=inner: _f(hidden_states).to(dtype)


def _norm_in_dtype(self: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """RMSNorm with the mean of squares accumulated in the input's own dtype."""
    x = hidden_states
    eps = getattr(self, "variance_epsilon", getattr(self, "eps", 1e-6))
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _gate_in_dtype(self: torch.nn.Module, hidden_states: torch.Tensor):
    """The DeepSeek router with its logits computed (and rounded) in the model's dtype; the
    grouped top-k then runs in fp32 on those rounded logits, as vLLM's gate does."""
    h = hidden_states.reshape(-1, self.hidden_dim)
    logits = F.linear(h, self.weight.to(h.dtype)).float()
    scores = logits.sigmoid()
    indices = grouped_topk(scores + self.e_score_correction_bias.float(), self)
    weights = scores.gather(1, indices)
    if self.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return logits, weights * self.routed_scaling_factor, indices


def _splitk_linear(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """x @ W^T with the reduction dimension in `splitk_parts` parts, each partial rounded to the
    dtype, summed in the dtype (split-K with reduced-precision reduction)."""
    parts = torch.tensor_split(torch.arange(self.in_features, device=x.device), self.splitk_parts)
    out = None
    for idx in parts:
        partial = F.linear(x.index_select(-1, idx), self.weight.index_select(1, idx))
        out = partial if out is None else out + partial
    return out if self.bias is None else out + self.bias


def _fp32_residual_layer(self: torch.nn.Module, hidden_states: torch.Tensor, **kwargs) -> torch.Tensor:
    """A pre-norm decoder layer whose residual stream stays in fp32: the sublayers run in the
    model's dtype on the normed (rounded) input, their outputs are added in fp32."""
    dtype = self.input_layernorm.weight.dtype
    residual = hidden_states.float()
    h = self.input_layernorm(residual).to(dtype)
    h, _ = self.self_attn(hidden_states=h, **kwargs)
    residual = residual + h.float()
    h = self.post_attention_layernorm(residual).to(dtype)
    return residual + self.mlp(h).float()


@dataclass(frozen=True)
class Routing:
    """Per MoE layer (decoder index -> tensor): the router's selection scores [T, E] in fp32
    and the experts it chose [T, k], for one forward of one prompt."""

    scores: dict[int, torch.Tensor]
    chosen: dict[int, torch.Tensor]


@contextmanager
def record_routing(model: torch.nn.Module) -> Iterator[Routing]:
    """Keeps, for the forwards inside the block, what every MoE router of `model` saw and
    chose (the last forward's). A router's output is (logits, weights, indices) in every
    implementation above, so the record does not depend on which one ran."""
    routing = Routing(scores={}, chosen={})
    hooks = []
    for k, gate in moe_routers(model).items():
        rule = router_rule(gate)

        def hook(mod, _args, out, k=k, rule=rule) -> None:
            logits, _weights, indices = out
            routing.scores[k] = rule.scores(mod, logits).detach().cpu()
            routing.chosen[k] = indices.detach().cpu()
        hooks.append(gate.register_forward_hook(hook))
    try:
        yield routing
    finally:
        for h in hooks:
            h.remove()
