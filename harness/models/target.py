"""The tiny DeepSeek-V3 target: MLA attention, grouped top-k routing, shared + routed experts.

The dimensions are not free: vLLM's CPU MLA backend accepts only bf16 and an MLA head dim
(kv_lora_rank + qk_rope_head_dim) of 320, 512 or 576, and it loads
`e_score_correction_bias` only under `topk_method: noaux_tc` with sigmoid scoring. The
model must load unchanged in transformers (the reference) and in vLLM (the engine under
test), so the config carries both sets of keys.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

NUM_LAYERS = 8


def target_config_dict(vocab_size: int = 512, num_layers: int = NUM_LAYERS) -> dict[str, Any]:
    """The one target shape the golden bundle uses; tests may shrink `num_layers`."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": vocab_size,
        "hidden_size": 128,
        "intermediate_size": 256,
        "moe_intermediate_size": 64,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
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


def build_target(config: dict[str, Any], seed: int) -> DeepseekV3ForCausalLM:
    torch.manual_seed(seed)
    hf_config = DeepseekV3Config(**{k: v for k, v in config.items() if k != "architectures"})
    hf_config.architectures = ["DeepseekV3ForCausalLM"]
    model = DeepseekV3ForCausalLM(hf_config)
    model.eval()
    return model


def load_target(path: str | Path, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu", placement: str | None = None) -> DeepseekV3ForCausalLM:
    """Load any HF-format DeepSeek-V3 checkpoint (ours or a user's); `placement`: a name of
    harness.models.placement.PLACEMENTS to spread it over the processes of a torchrun launch
    (each rank then holds its own shards on its own device, and `device` is not used)."""
    if placement is not None:
        from harness.models.placement import load_target_placed

        return load_target_placed(path, dtype, placement)
    model = DeepseekV3ForCausalLM.from_pretrained(str(path), dtype=dtype)
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


def _router_margin(gate: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """routing_margin of the fp32 selection scores the router computes from `hidden`."""
    h = hidden.reshape(-1, gate.hidden_dim).float()
    scores = F.linear(h, gate.weight.float()).sigmoid() + gate.e_score_correction_bias.float()
    return routing_margin(scores, gate)


@torch.no_grad()
def routing_margins(model: torch.nn.Module, prompt: list[int]) -> torch.Tensor:
    """[N+1, T]: for boundary b and token t, the smallest router margin over the MoE layers
    before b (inf where none precedes b). Where it is tiny, a reduced-precision engine may
    route that token to another expert and legitimately differ from the fp32 boundary."""
    layers = decoder_layers(model)
    per_layer: dict[int, torch.Tensor] = {}
    hooks = [layer.mlp.gate.register_forward_pre_hook(
        lambda mod, args, k=k: per_layer.__setitem__(k, _router_margin(mod, args[0])))
        for k, layer in enumerate(layers) if hasattr(layer.mlp, "gate")]
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
