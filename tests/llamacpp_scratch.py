"""Scratch models for the llama.cpp tests (tests/test_llamacpp_*.py): a tiny Qwen3-MoE target
with random weights, an architecture whose llama.cpp graph records every layer's input (which
the committed bundle's deepseek2 does not), and a random EAGLE-3 draft for it in SpecForge's
layout with top-level ids (llama.cpp's converter reads no other). Random weights are enough:
the capture is compared with transformers on the same weights, and speculative greedy output
must equal plain greedy output whatever the draft proposes.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

VOCAB = 256
HIDDEN = 64
LAYERS = 4


def build_qwen3moe(folder: Path, seed: int = 0) -> Path:
    """A 4-layer Qwen3-MoE (4 experts, top 2) saved with safetensors; returns `folder`."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    config = Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=LAYERS, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
        num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[],
        norm_topk_prob=True, max_position_embeddings=512, rms_norm_eps=1e-6,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=1)
    model = Qwen3MoeForCausalLM(config).float().eval()
    with torch.no_grad():  # transformers initialises norms to 1: make them count too
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def build_draft(folder: Path, layer_ids: list[int], seed: int = 1, draft_vocab: int = 128) -> Path:
    """A random EAGLE-3 draft for `build_qwen3moe`'s target, ids at the top level."""
    g = torch.Generator().manual_seed(seed)
    h, heads, hd, ff = HIDDEN, 2, 32, 128

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.05

    tensors = {
        "d2t": torch.zeros(draft_vocab, dtype=torch.int64),
        "t2d": torch.arange(VOCAB) < draft_vocab,
        "embed_tokens.weight": w(VOCAB, h), "fc.weight": w(h, len(layer_ids) * h),
        "lm_head.weight": w(draft_vocab, h), "norm.weight": torch.ones(h),
        "midlayer.hidden_norm.weight": torch.ones(h), "midlayer.input_layernorm.weight": torch.ones(h),
        "midlayer.post_attention_layernorm.weight": torch.ones(h),
        "midlayer.mlp.down_proj.weight": w(h, ff), "midlayer.mlp.gate_proj.weight": w(ff, h),
        "midlayer.mlp.up_proj.weight": w(ff, h),
        "midlayer.self_attn.q_proj.weight": w(heads * hd, 2 * h),
        "midlayer.self_attn.k_proj.weight": w(heads * hd, 2 * h),
        "midlayer.self_attn.v_proj.weight": w(heads * hd, 2 * h),
        "midlayer.self_attn.o_proj.weight": w(h, heads * hd),
    }
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "vocab_size": VOCAB,
        "draft_vocab_size": draft_vocab, "hidden_size": h, "target_hidden_size": h,
        "num_hidden_layers": 1, "num_attention_heads": heads, "num_key_value_heads": heads,
        "head_dim": hd, "intermediate_size": ff, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "max_position_embeddings": 512, "tie_word_embeddings": False,
        "torch_dtype": "float32", "bos_token_id": 0, "eos_token_id": 1,
        "eagle_aux_hidden_state_layer_ids": list(layer_ids),
    }
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


MARK = 5  # the channel a constant drafter reads (see `constant_drafter`)


def mark_embeddings(target: Path) -> None:
    """Set channel MARK of every token embedding of a `build_qwen3moe` target to 1: boundary
    0 (the embedding, llama.cpp id 0) then carries a constant a drafter can read."""
    from safetensors.torch import load_file

    path = target / "model.safetensors"
    tensors = load_file(str(path))
    tensors["model.embed_tokens.weight"][:, MARK] = 1.0
    save_file(tensors, str(path), metadata={"format": "pt"})


def constant_drafter(draft: Path, token: int) -> None:
    """Make a `build_draft` draft (ids starting with 0, on a `mark_embeddings` target) propose
    `token` at every step, by a margin no sampler choice can undo: fc puts 10 x the embedding's MARK channel into the draft state's channel MARK,
    attention and MLP write nothing there, so it stays 10 through the draft's recurrence; the
    final norm keeps that channel alone, and lm_head scores draft id 0 alone from it (logit
    ~400, the others 0); d2t sends draft id 0 to `token` (and `token` to 0, since llama.cpp's
    converter refuses a d2t with duplicate targets: a plain "every id -> token" is refused)."""
    from safetensors.torch import load_file

    path = draft / "model.safetensors"
    tensors = load_file(str(path))
    h = HIDDEN
    tensors["fc.weight"][MARK] = 0.0
    tensors["fc.weight"][MARK, MARK] = 10.0  # slot 0's channel MARK
    tensors["midlayer.self_attn.o_proj.weight"][MARK] = 0.0
    tensors["midlayer.mlp.down_proj.weight"][MARK] = 0.0
    tensors["norm.weight"] = torch.zeros(h)
    tensors["norm.weight"][MARK] = 1.0
    tensors["lm_head.weight"].zero_()
    tensors["lm_head.weight"][0, MARK] = 50.0
    d2t = torch.zeros_like(tensors["d2t"])
    d2t[0] = token
    if token < d2t.numel():
        d2t[token] = -token
    tensors["d2t"] = d2t
    save_file(tensors, str(path))


def boundaries(target: Path, prompt: list[int]) -> torch.Tensor:
    """[N + 1, T, H] fp32 from transformers: boundary b < N is `output_hidden_states[b]` (the
    input of layer b), b = N the last layer's output recorded before the final norm."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    final: list[torch.Tensor] = []
    hook = model.model.norm.register_forward_pre_hook(lambda _m, args: final.append(args[0].detach()))
    try:
        with torch.no_grad():
            out = model(torch.tensor([prompt]), output_hidden_states=True)
    finally:
        hook.remove()
    states = [s[0] for s in out.hidden_states[:LAYERS]] + [final[0][0]]
    return torch.stack(states)
