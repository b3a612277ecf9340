"""The EAGLE-3 draft exactly as SpecForge trains it (`LlamaForCausalLMEagle3`).

This module is the training-time reference: the golden builder trains it, the reference
engine serves it, and every engine is judged against what it computes. Its state-dict
keys are SpecForge's checkpoint layout (`fc`, `midlayer.*`, `norm`, `lm_head`, `d2t`,
`t2d`) so the same folder loads in vLLM and SGLang without conversion.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

DRAFT_ARCHITECTURE = "LlamaForCausalLMEagle3"


@dataclass(frozen=True)
class DraftConfig:
    """What a draft's config.json promises; `aux_layer_ids` are in the config's convention."""

    vocab_size: int
    draft_vocab_size: int
    hidden_size: int
    target_hidden_size: int
    aux_layer_ids: tuple[int, ...]
    num_attention_heads: int = 2
    num_key_value_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 512
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 512
    norm_before_fc: bool = False
    fc_norm: bool = False
    architectures: tuple[str, ...] = (DRAFT_ARCHITECTURE,)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def num_aux(self) -> int:
        return len(self.aux_layer_ids)

    def to_json(self) -> dict[str, Any]:
        return {
            "architectures": list(self.architectures),
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "hidden_size": self.hidden_size,
            "target_hidden_size": self.target_hidden_size,
            "num_hidden_layers": 1,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": False,
            "norm_before_fc": self.norm_before_fc,
            "fc_norm": self.fc_norm,
            "torch_dtype": "float32",
            "bos_token_id": 0,
            "eos_token_id": 1,
            "pad_token_id": 2,
            "eagle_config": {
                "eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids),
                "use_aux_hidden_state": True,
            },
            **self.extra,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DraftConfig:
        """Read a SpecForge-style (nested `eagle_config`) or speculators-style (top-level ids,
        the llama fields under `transformer_layer_config`) config."""
        data = {**(data.get("transformer_layer_config") or {}), **data}
        eagle = data.get("eagle_config") or {}
        ids = eagle.get("eagle_aux_hidden_state_layer_ids", data.get("eagle_aux_hidden_state_layer_ids"))
        if ids is None:
            raise ValueError("draft config has no eagle_aux_hidden_state_layer_ids "
                             "(neither in eagle_config nor at top level); add the ids training used")
        hidden = int(data["hidden_size"])
        return cls(
            vocab_size=int(data["vocab_size"]),
            draft_vocab_size=int(data.get("draft_vocab_size", data["vocab_size"])),
            hidden_size=hidden,
            target_hidden_size=int(data.get("target_hidden_size") or hidden),
            aux_layer_ids=tuple(int(i) for i in ids),
            num_attention_heads=int(data["num_attention_heads"]),
            num_key_value_heads=int(data.get("num_key_value_heads", data["num_attention_heads"])),
            head_dim=int(data.get("head_dim") or hidden // int(data["num_attention_heads"])),
            intermediate_size=int(data["intermediate_size"]),
            rms_norm_eps=float(data.get("rms_norm_eps", 1e-6)),
            rope_theta=float(data.get("rope_theta", 10000.0)),
            max_position_embeddings=int(data.get("max_position_embeddings", 2048)),
            norm_before_fc=bool(data.get("norm_before_fc", False)),
            fc_norm=bool(data.get("fc_norm", False)),
            architectures=tuple(data.get("architectures") or ()),
        )


# speculators' checkpoints (its Eagle3Converter, vLLM's speculators format) name the one decoder
# layer `layers.0.*`; SpecForge's, and this module's, `midlayer.*`. Same tensors otherwise.
SPECULATORS_LAYER, SPECFORGE_LAYER = "layers.0.", "midlayer."


def speculators_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A draft state dict in SpecForge's key layout, whichever layout it was saved in: a
    speculators-format draft loads natively (issue #36), and a key of any other layer
    (`layers.1.*`: a draft of several layers, which this reference does not model) is left as
    is, so loading reports it as unexpected instead of dropping it."""
    return {(SPECFORGE_LAYER + k[len(SPECULATORS_LAYER):] if k.startswith(SPECULATORS_LAYER) else k): v
            for k, v in state.items()}


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rotary_tables(positions: torch.Tensor, d: int, theta: float,
                  dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of Neox-style rotary embedding (Llama's, which vLLM and SGLang use for the
    draft) at `positions` [B, T], as [B, 1, T, d] in `dtype`: built once for a step's queries and
    keys alike (the same values `rotary` would build for each; a tenth of weight inference's
    time went to building them twice)."""
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=positions.device, dtype=torch.float32) / d))
    ang = positions.to(torch.float32)[..., None] * inv  # [B, T, d/2]
    cos, sin = ang.cos(), ang.sin()
    return torch.cat([cos, cos], -1)[:, None].to(dtype), torch.cat([sin, sin], -1)[:, None].to(dtype)


def rotary(x: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x [B, heads, T, d] rotated by `rotary_tables` of its positions."""
    cos, sin = tables
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


class DraftAttention(nn.Module):
    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.cfg = cfg
        width = 2 * cfg.hidden_size
        self.q_proj = nn.Linear(width, cfg.num_attention_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(width, cfg.num_key_value_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(width, cfg.num_key_value_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size, bias=False)

    def qkv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b, t, _ = x.shape
        c = self.cfg
        q = self.q_proj(x).view(b, t, c.num_attention_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        tables = rotary_tables(positions, c.head_dim, c.rope_theta, q.dtype)
        return rotary(q, tables), rotary(k, tables), v

    def query_heads(self, kv: torch.Tensor) -> torch.Tensor:
        """Key/value heads [B, kvh, T, d] repeated for the query heads they serve; where each
        serves one, as they are, not a copy (a twentieth of weight inference's time was such
        copies)."""
        rep = self.cfg.num_attention_heads // self.cfg.num_key_value_heads
        return kv.repeat_interleave(rep, dim=1) if rep > 1 else kv

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               mask: torch.Tensor) -> torch.Tensor:
        """mask: bool [B or 1, 1, Tq, Tk], True = may attend."""
        k, v = self.query_heads(k), self.query_heads(v)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.cfg.head_dim)
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        out = scores.softmax(-1) @ v
        b, h, t, d = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, h * d))


class DraftMLP(nn.Module):
    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    """The single decoder layer: attention over cat(norm(embed), norm(hidden)), width 2H."""

    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg)
        self.mlp = DraftMLP(cfg)

    def attention_input(self, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)

    def finish(self, hidden: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """Residual + MLP after attention; returns the pre-norm output (the recurrent state)."""
        h = hidden + attn_out
        return h + self.mlp(self.post_attention_layernorm(h))


@dataclass
class DraftKV:
    """The draft's KV cache: one entry per position it has seen, truncatable on rejection."""

    k: torch.Tensor | None = None  # [B, kvh, S, d]
    v: torch.Tensor | None = None
    positions: torch.Tensor | None = None  # [B, S]

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> None:
        if self.k is None:
            self.k, self.v, self.positions = k, v, positions
        else:
            self.k = torch.cat([self.k, k], 2)
            self.v = torch.cat([self.v, v], 2)
            self.positions = torch.cat([self.positions, positions], 1)

    def truncate(self, length: int) -> None:
        if self.k is not None:
            self.k, self.v = self.k[:, :, :length], self.v[:, :, :length]
            self.positions = self.positions[:, :length]

    def clone(self) -> DraftKV:
        if self.k is None:
            return DraftKV()
        return DraftKV(self.k.clone(), self.v.clone(), self.positions.clone())


class Eagle3Draft(nn.Module):
    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.fc = nn.Linear(cfg.num_aux * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        # Norm weight names are those vLLM's llama_eagle3 loads (`input_norm`, `fc_norm.{i}`).
        if cfg.norm_before_fc:
            self.input_norm = RMSNorm(cfg.num_aux * cfg.target_hidden_size, cfg.rms_norm_eps)
        if cfg.fc_norm:
            self.fc_norm = nn.ModuleList(
                RMSNorm(cfg.target_hidden_size, cfg.rms_norm_eps) for _ in range(cfg.num_aux))
        self.midlayer = DraftLayer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool))

    # --- the fc projection: once, on the target's concatenated aux states -------------
    def project(self, aux: torch.Tensor) -> torch.Tensor:
        """aux: [..., num_aux * target_hidden] in training slot order -> [..., hidden]."""
        if self.cfg.fc_norm:
            chunks = aux.split(self.cfg.target_hidden_size, dim=-1)
            aux = torch.cat([n(c) for n, c in zip(self.fc_norm, chunks, strict=True)], dim=-1)
        if self.cfg.norm_before_fc:
            aux = self.input_norm(aux)
        return self.fc(aux)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocab logits from the pre-norm output."""
        return self.lm_head(self.norm(hidden))

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def step(self, input_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
             kv: DraftKV) -> torch.Tensor:
        """Run new positions through the draft with a KV cache; returns pre-norm outputs.

        input_ids: [B, T] (the token *after* each hidden's position), hidden: [B, T, H],
        positions: [B, T]. Each new query attends to every cached position <= its own and
        to the new ones causally.
        """
        layer = self.midlayer
        x = layer.attention_input(self.embed_tokens(input_ids), hidden)
        q, k, v = layer.self_attn.qkv(x, positions)
        past = kv.length
        kv.append(k, v, positions)
        t = input_ids.shape[1]
        key_pos = kv.positions  # [B, S]
        mask = key_pos[:, None, :] <= positions[:, :, None]  # [B, T, S]
        new = torch.arange(kv.length, device=positions.device) >= past
        causal_new = torch.ones(t, kv.length, dtype=torch.bool, device=positions.device)
        causal_new[:, past:] = torch.tril(torch.ones(t, t, dtype=torch.bool, device=positions.device))
        mask = torch.where(new[None, None, :], causal_new[None], mask)
        attn = layer.self_attn.attend(q, kv.k, kv.v, mask[:, None])
        return layer.finish(hidden, attn)

    # --- checkpoint IO in SpecForge's layout -------------------------------------------
    def save(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().clone() for k, v in self.state_dict().items()}
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps(self.cfg.to_json(), indent=2) + "\n")

    @classmethod
    def load(cls, folder: str | Path, dtype: torch.dtype = torch.float32,
             device: str | torch.device = "cpu") -> Eagle3Draft:
        folder = Path(folder)
        cfg = DraftConfig.from_json(json.loads((folder / "config.json").read_text()))
        model = cls(cfg)
        state = speculators_keys(load_file(str(folder / "model.safetensors")))
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [m for m in missing if m != "embed_tokens.weight"]
        if missing or unexpected:
            raise ValueError(f"draft checkpoint {folder} does not match its config: "
                             f"missing {missing}, unexpected {unexpected}")
        model = model.to(device)
        for p in model.parameters():
            p.data = p.data.to(dtype)
        return model.eval()
