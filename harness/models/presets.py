"""Target and draft shapes beyond the tiny bundle, with seeded random weights, for the GPU
tier (tests/test_gpu_tier.py): throughput and the cost model need a target of realistic
width, and the layer-id diagnosis needs the motivating case's depth.

Random weights are enough for both: kernel costs depend on shapes, not values, and capture is
a question of which residual-stream boundary a slot holds, which random weights still make
distinct (the GPU tier measures how distinct, and says so where they are not).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

from harness.models.draft import DraftConfig, Eagle3Draft
from harness.models.target import target_config_dict


def width_realistic_config() -> dict[str, Any]:
    """DeepSeek-V2-Lite's published shape (27 layers, hidden 2048, 64 routed + 2 shared
    experts, top-6, MLA with kv_lora_rank 512, first layer dense) in the DeepSeek-V3
    architecture the bundle uses (sigmoid scoring, noaux_tc): ~15.7B parameters."""
    cfg = target_config_dict(vocab_size=102400, num_layers=27)
    cfg.update(hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408,
               num_attention_heads=16, num_key_value_heads=16, n_shared_experts=2,
               n_routed_experts=64, num_experts_per_tok=6, n_group=1, topk_group=1,
               kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
               max_position_embeddings=4096)
    return cfg


def motivating_depth_config() -> dict[str, Any]:
    """The motivating target's depth (Kimi-K2.5, DeepSeek-V3 architecture: 61 layers) at
    hidden 1024 with 64 routed experts and MLA, so 62 boundaries fit on one GPU in fp32 (the
    golden reference) and bf16 (the engine) side by side."""
    cfg = target_config_dict(vocab_size=4096, num_layers=61)
    cfg.update(hidden_size=1024, intermediate_size=2816, moe_intermediate_size=256,
               num_attention_heads=8, num_key_value_heads=8, n_shared_experts=1,
               n_routed_experts=64, num_experts_per_tok=6, n_group=8, topk_group=4,
               kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=64, v_head_dim=64,
               max_position_embeddings=4096)
    return cfg


def build_target_on(config: dict[str, Any], seed: int, device: str | torch.device,
                    dtype: torch.dtype) -> DeepseekV3ForCausalLM:
    """Construct (and initialise) directly on `device` in `dtype`: a 15B-parameter target
    built on the CPU in fp32 first would need 63 GB of host memory and minutes."""
    torch.manual_seed(seed)
    hf = DeepseekV3Config(**{k: v for k, v in config.items() if k != "architectures"})
    hf.architectures = ["DeepseekV3ForCausalLM"]
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = DeepseekV3ForCausalLM(hf)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def random_draft(target_config: dict[str, Any], layer_ids: tuple[int, ...], seed: int,
                 device: str | torch.device, dtype: torch.dtype,
                 draft_vocab_size: int = 32000) -> Eagle3Draft:
    """An untrained EAGLE-3 draft of a Llama-style decoder layer sized for the target (head dim
    128, as many KV heads: the reference draft has no grouped-query attention): its kernels cost what a trained draft's cost, its acceptance is ~0."""
    torch.manual_seed(seed)
    hidden = int(target_config["hidden_size"])
    cfg = DraftConfig(vocab_size=int(target_config["vocab_size"]),
                      draft_vocab_size=min(draft_vocab_size, int(target_config["vocab_size"])),
                      hidden_size=hidden, target_hidden_size=hidden, aux_layer_ids=layer_ids,
                      num_attention_heads=hidden // 128, num_key_value_heads=hidden // 128, head_dim=128,
                      intermediate_size=4 * hidden, max_position_embeddings=4096)
    with torch.device(device):
        draft = Eagle3Draft(cfg)
        for p in draft.parameters():
            torch.nn.init.normal_(p, std=0.02)
    return draft.to(dtype).eval()
