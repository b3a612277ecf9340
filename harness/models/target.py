"""The tiny golden targets, one per architecture, behind one seam (`TargetArchitecture`).

The committed bundle's target is a tiny DeepSeek-V3 (MLA attention, grouped top-k routing,
shared + routed experts). Its dimensions are not free: vLLM's CPU MLA backend accepts only
bf16 and an MLA head dim (kv_lora_rank + qk_rope_head_dim) of 320, 512 or 576, and it loads
`e_score_correction_bias` only under `topk_method: noaux_tc` with sigmoid scoring. The
model must load unchanged in transformers (the reference) and in vLLM (the engine under
test), so the config carries both sets of keys.

The second target is a tiny Qwen3-MoE (issue #37): llama.cpp cannot capture layer inputs on a
DeepSeek graph (deepseek2 records no `t_layer_inp`), but it can on qwen3moe, so a bundle on
that architecture is the one on which llama.cpp's EAGLE-3 path can be judged at all. What
differs between the two is only what the seam holds: the config, the transformers classes, and
how the router turns logits into the scores its top-k selects on (sigmoid + correction bias,
grouped, for DeepSeek; a softmax, plain top-k, for Qwen3-MoE). Everything else the harness
hooks (decoder layers, `layer.mlp`, the final `model.norm`) has the same names in both.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import (
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

NUM_LAYERS = 8


def _shared_dims(vocab_size: int, num_layers: int) -> dict[str, Any]:
    """The dimensions both golden targets share (in this key order: a config's bytes, and so
    the bundle's hashes, follow it), so the bundles differ only in what the architecture is."""
    return {"vocab_size": vocab_size, "hidden_size": 128, "intermediate_size": 256,
            "moe_intermediate_size": 64, "num_hidden_layers": num_layers,
            "num_attention_heads": 2, "num_key_value_heads": 2}


def target_config_dict(vocab_size: int = 512, num_layers: int = NUM_LAYERS) -> dict[str, Any]:
    """The one target shape the golden bundle uses; tests may shrink `num_layers`."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        **_shared_dims(vocab_size, num_layers),
        "n_shared_experts": 1,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_group": 2,
        "topk_group": 1,
        "routed_scaling_factor": 1.0,
        "first_k_dense_replace": 1,
        "norm_topk_prob": True,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "kv_lora_rank": 256,
        "q_lora_rank": None,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 32,
        "v_head_dim": 32,
        "hidden_act": "silu",
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "rope_interleave": True,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 2,
        "num_nextn_predict_layers": 0,
        "moe_layer_freq": 1,
        "initializer_range": 0.02,
        "torch_dtype": "float32",
    }


def qwen3_moe_config_dict(vocab_size: int = 512, num_layers: int = NUM_LAYERS) -> dict[str, Any]:
    """The tiny Qwen3-MoE target (issue #37): the DeepSeek target's width, depth, expert count
    and top-2 where the architectures share a notion, so the two bundles differ in the
    architecture rather than in size. Every layer is MoE (`mlp_only_layers` empty, sparse step
    1): llama.cpp's qwen3moe graph has no dense layers, and a layout it cannot load would test
    nothing. Two query and two KV heads of width 64 (Qwen3's q/k norms act per head)."""
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        **_shared_dims(vocab_size, num_layers),
        "head_dim": 64,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "output_router_logits": False,
        "hidden_act": "silu",
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "use_sliding_window": False,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 2,
        "initializer_range": 0.02,
        "torch_dtype": "float32",
    }


@dataclass(frozen=True)
class RouterRule:
    """How one architecture's MoE router selects experts, as the harness needs to know it:
    the fp32 selection scores [T, E] from the router logits (what the top-k runs on), the
    experts chosen from them [T, k], and the margin by which the choice was made (a margin
    near zero is a tie that reduced precision can flip). Used by the precision envelope's
    routing-tie marks and by `routing_margins`."""

    scores: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]
    choose: Callable[[torch.Tensor, torch.nn.Module], torch.Tensor]
    margin: Callable[[torch.Tensor, torch.nn.Module], torch.Tensor]


@dataclass(frozen=True)
class TargetArchitecture:
    """One target architecture a golden bundle can be built on (`golden build --arch NAME`):
    its config, its transformers classes, its router's class and rule, and how a bundle built
    on it describes itself. The one seam between the DeepSeek-V3 and the Qwen3-MoE bundles."""

    name: str
    model_type: str
    config_class: type[PretrainedConfig]
    model_class: type[PreTrainedModel]
    router_class_name: str
    router: RouterRule
    config_dict: Callable[[int, int], dict[str, Any]]
    description: str
    # the committed bundle built on it (golden/<bundle>): the target a rebuild that cannot
    # train a usable one here starts from (`golden build --target-from golden/<bundle>/target`)
    bundle: str

    def is_router(self, module: object) -> bool:
        """Whether `module` is this architecture's MoE router (a dense layer has none)."""
        return type(module).__name__ == self.router_class_name


def build_target(config: dict[str, Any], seed: int) -> PreTrainedModel:
    """A freshly initialised target of `config` (its `model_type` picks the architecture)."""
    arch = architecture(config.get("model_type", "deepseek_v3"))
    torch.manual_seed(seed)
    hf_config = arch.config_class(**{k: v for k, v in config.items() if k != "architectures"})
    hf_config.architectures = [arch.model_class.__name__]
    model = arch.model_class(hf_config)
    model.eval()
    return model


def load_target(path: str | Path, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu", placement: str | None = None) -> PreTrainedModel:
    """Load an HF-format checkpoint of a known architecture (ours or a user's) with its own
    class; DeepSeek-V3 where the config names no known model type (what this loader always
    did). `placement`: a name of harness.models.placement.PLACEMENTS to spread it over the
    processes of a torchrun launch (each rank then holds its own shards on its own device,
    and `device` is not used)."""
    if placement is not None:
        from harness.models.placement import load_target_placed

        return load_target_placed(path, dtype, placement)
    model = architecture_at(path).model_class.from_pretrained(str(path), dtype=dtype)
    return model.to(device).eval()


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    inner = getattr(model, "model", model)
    return inner.layers


def grouped_topk(scores: torch.Tensor, gate: torch.nn.Module) -> torch.Tensor:
    """[T, k]: the experts DeepSeek's grouped top-k routing picks from selection scores
    [T, E] (sigmoid scores plus the correction bias): the `topk_group` groups with the best
    two-expert sums, then the best `top_k` experts inside them."""
    per_group = gate.num_experts // gate.num_group
    group = scores.view(-1, gate.num_group, per_group).topk(2, dim=-1).values.sum(-1)
    chosen = torch.zeros_like(group).scatter_(1, group.topk(gate.topk_group, -1).indices, 1).bool()
    allowed = scores.masked_fill(~chosen.repeat_interleave(per_group, -1), float("-inf"))
    return allowed.topk(gate.top_k, dim=-1).indices


def routing_margin(scores: torch.Tensor, gate: torch.nn.Module) -> torch.Tensor:
    """Per token: how far grouped top-k routing is from choosing differently, in selection
    score units (the smaller of the group-selection gap and the expert-selection gap), given
    the selection scores [T, E]. A margin near zero is a tie that reduced-precision hidden
    states can flip, swapping an expert."""
    per_group = gate.num_experts // gate.num_group
    group = scores.view(-1, gate.num_group, per_group).topk(2, dim=-1).values.sum(-1)
    inf = torch.full((scores.shape[0],), float("inf"))
    if gate.topk_group < gate.num_group:
        ranked = group.sort(-1, descending=True).values
        group_gap = ranked[:, gate.topk_group - 1] - ranked[:, gate.topk_group]
    else:
        group_gap = inf
    chosen = torch.zeros_like(group).scatter_(1, group.topk(gate.topk_group, -1).indices, 1).bool()
    allowed = scores.masked_fill(~chosen.repeat_interleave(per_group, -1), float("-inf"))
    ranked = allowed.sort(-1, descending=True).values
    expert_gap = (ranked[:, gate.top_k - 1] - ranked[:, gate.top_k]) if gate.top_k < allowed.shape[-1] else inf
    return torch.minimum(group_gap, expert_gap.nan_to_num(float("inf")))


def _deepseek_scores(gate: torch.nn.Module, logits: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V3's selection scores: sigmoid of the logits plus the correction bias."""
    return logits.float().sigmoid() + gate.e_score_correction_bias.float()


def _softmax_scores(gate: torch.nn.Module, logits: torch.Tensor) -> torch.Tensor:
    """Qwen3-MoE's selection scores: the softmax over the experts, in fp32 as its router."""
    return torch.softmax(logits.float(), dim=-1)


def plain_topk(scores: torch.Tensor, gate: torch.nn.Module) -> torch.Tensor:
    """[T, k]: the `top_k` best-scoring experts (Qwen3-MoE's routing: no groups, no bias)."""
    return scores.topk(gate.top_k, dim=-1).indices


def plain_margin(scores: torch.Tensor, gate: torch.nn.Module) -> torch.Tensor:
    """Per token: the gap between the k-th and the (k+1)-th best score, the one comparison a
    plain top-k decides by (inf when every expert is chosen)."""
    if gate.top_k >= scores.shape[-1]:
        return torch.full((scores.shape[0],), float("inf"))
    ranked = scores.sort(-1, descending=True).values
    return ranked[:, gate.top_k - 1] - ranked[:, gate.top_k]


ARCHITECTURES: dict[str, TargetArchitecture] = {
    "deepseek-v3": TargetArchitecture(
        name="deepseek-v3", model_type="deepseek_v3", config_class=DeepseekV3Config,
        model_class=DeepseekV3ForCausalLM, router_class_name="DeepseekV3TopkRouter",
        router=RouterRule(scores=_deepseek_scores, choose=grouped_topk, margin=routing_margin),
        config_dict=target_config_dict,
        description="tiny DeepSeek-V3 (MLA + MoE) target on a synthetic language and EAGLE-3 "
                    "drafts trained with TTT in SpecForge's layout",
        bundle="tiny-dsv3"),
    "qwen3-moe": TargetArchitecture(
        name="qwen3-moe", model_type="qwen3_moe", config_class=Qwen3MoeConfig,
        model_class=Qwen3MoeForCausalLM, router_class_name="Qwen3MoeTopKRouter",
        router=RouterRule(scores=_softmax_scores, choose=plain_topk, margin=plain_margin),
        config_dict=qwen3_moe_config_dict,
        description="tiny Qwen3-MoE (GQA with q/k norms + softmax top-2 MoE) target on a "
                    "synthetic language and EAGLE-3 drafts trained with TTT in SpecForge's "
                    "layout",
        bundle="tiny-qwen3moe"),
}
DEFAULT_ARCHITECTURE = "deepseek-v3"


def architecture(name_or_model_type: str) -> TargetArchitecture:
    """The architecture called `name_or_model_type` (a builder name such as 'qwen3-moe', or an
    HF `model_type` such as 'qwen3_moe'); ValueError names the known ones."""
    for arch in ARCHITECTURES.values():
        if name_or_model_type in (arch.name, arch.model_type):
            return arch
    raise ValueError(f"no golden target architecture {name_or_model_type!r}; known: "
                     f"{', '.join(ARCHITECTURES)}")


def architecture_at(path: str | Path) -> TargetArchitecture:
    """The architecture of the checkpoint at `path` by its config's `model_type`; DeepSeek-V3
    where the config is absent or names another (the loader's behaviour before the seam)."""
    try:
        model_type = json.loads((Path(path) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        model_type = None
    try:
        return architecture(model_type) if model_type else ARCHITECTURES[DEFAULT_ARCHITECTURE]
    except ValueError:
        return ARCHITECTURES[DEFAULT_ARCHITECTURE]


def architecture_of(model: torch.nn.Module) -> TargetArchitecture:
    """The architecture of a loaded target, by its config's `model_type`."""
    config = getattr(model, "config", None)
    return architecture(getattr(config, "model_type", DEFAULT_ARCHITECTURE.replace("-", "_")))


def router_rule(gate: torch.nn.Module) -> RouterRule:
    """The rule of the architecture whose router `gate` is (by its class)."""
    for arch in ARCHITECTURES.values():
        if arch.is_router(gate):
            return arch.router
    raise ValueError(f"{type(gate).__name__} is not the router of a known architecture "
                     f"({', '.join(a.router_class_name for a in ARCHITECTURES.values())})")


def moe_routers(model: torch.nn.Module) -> dict[int, torch.nn.Module]:
    """Decoder index -> MoE router, for the layers that route (any known architecture)."""
    out: dict[int, torch.nn.Module] = {}
    for k, layer in enumerate(decoder_layers(model)):
        gate = getattr(getattr(layer, "mlp", None), "gate", None)
        if gate is not None and any(a.is_router(gate) for a in ARCHITECTURES.values()):
            out[k] = gate
    return out


def _router_margin(gate: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """The router's margin for the fp32 selection scores it computes from `hidden`."""
    rule = router_rule(gate)
    h = hidden.reshape(-1, gate.hidden_dim).float()
    return rule.margin(rule.scores(gate, F.linear(h, gate.weight.float())), gate)


@torch.no_grad()
def routing_margins(model: torch.nn.Module, prompt: list[int]) -> torch.Tensor:
    """[N+1, T]: for boundary b and token t, the smallest router margin over the MoE layers
    before b (inf where none precedes b). Where it is tiny, a reduced-precision engine may
    route that token to another expert and legitimately differ from the fp32 boundary."""
    layers = decoder_layers(model)
    per_layer: dict[int, torch.Tensor] = {}
    hooks = [gate.register_forward_pre_hook(
        lambda mod, args, k=k: per_layer.__setitem__(k, _router_margin(mod, args[0])))
        for k, gate in moe_routers(model).items()]
    try:
        model(input_ids=torch.tensor([list(prompt)]))
    finally:
        for h in hooks:
            h.remove()
    out = torch.full((len(layers) + 1, len(prompt)), float("inf"))
    running = out[0].clone()
    for b in range(1, len(layers) + 1):
        if b - 1 in per_layer:
            running = torch.minimum(running, per_layer[b - 1])
        out[b] = running
    return out
