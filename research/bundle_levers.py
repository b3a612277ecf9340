"""Bounded measurement of target-side levers that make a one-boundary wiring shift costly.

Why: on the rebuilt bundle, feeding every aux slot one boundary early costs only 0.9-2.2% of
held-out acceptance, because in an 8-layer, 128-wide pre-norm residual target adjacent
boundaries h_k and h_{k+1} = h_k + update_k are nearly the same vector. This script trains,
per lever, a target (the same transformers DeepseekV3ForCausalLM architecture; only weights
at init or config values change), one or two drafts with TTT, and measures held-out
acceptance served as trained and with every slot one boundary early (-1) and late (+1).
Everything is at REDUCED size (fewer target steps, fewer draft sequences and epochs) so one
lever fits in ~15 minutes on one thread; every lever is compared against a baseline trained
the same reduced way on the same language (seed 0).

    OMP_NUM_THREADS=1 PYTHONPATH=. python research/bundle_levers.py \
        --levers baseline oscale4 oscale16 --out /tmp/levers.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from harness.golden.builder import (
    NUM_DRAFT_TOKENS,
    REGEN_PROMPT_LEN,
    draft_data,
    draft_recipes,
    train_recipe_draft,
)
from harness.golden.corpus import Language, make_language, sample_batch
from harness.golden.features import target_features
from harness.golden.training import is_periodic, regenerate, train_target_model
from harness.golden.wirings import SERVED, mean_acceptance_length, per_prompt_acceptance, wirings
from harness.models.target import build_target, decoder_layers, target_config_dict


@dataclass(frozen=True)
class Lever:
    """A target variant: config overrides, and init-time scaling of the weights that write
    into the residual stream (attention o_proj, MLP / shared / routed expert down_proj)."""

    name: str
    out_scale: float = 1.0
    scaled_layers: tuple[int, ...] | None = None  # None: every layer
    norm_scale: float = 1.0  # init of input/post-attention RMSNorm weights on scaled_layers
    depth_scale: float = 1.0  # layer k's out_scale is multiplied by depth_scale ** k
    decorrelate: float = 0.0  # weight of the adjacent-boundary cos^2 penalty in target training
    config: dict[str, Any] = field(default_factory=dict)


LEVERS: dict[str, Lever] = {
    "baseline": Lever("baseline"),
    "oscale4": Lever("oscale4", out_scale=4.0),
    "oscale16": Lever("oscale16", out_scale=16.0),
    "oscale64": Lever("oscale64", out_scale=64.0),
    "geom2": Lever("geom2", depth_scale=2.0),
    "decor1": Lever("decor1", decorrelate=1.0),
    "decor0.3": Lever("decor0.3", decorrelate=0.3),
}


@dataclass(frozen=True)
class Size:
    target_steps: int = 400
    train_sequences: int = 256
    heldout_sequences: int = 32
    draft_epochs: int = 4
    heldout_prompts: int = 12
    continuation_len: int = 32


@torch.no_grad()
def apply_lever(model: torch.nn.Module, lever: Lever) -> None:
    layers = decoder_layers(model)
    chosen = range(len(layers)) if lever.scaled_layers is None else lever.scaled_layers
    for k in chosen:
        layer = layers[k]
        scale = lever.out_scale * lever.depth_scale ** k
        if scale != 1.0:
            layer.self_attn.o_proj.weight.mul_(scale)
            mlp = layer.mlp
            if hasattr(mlp, "down_proj"):
                mlp.down_proj.weight.mul_(scale)
            if hasattr(mlp, "experts"):
                down = mlp.experts.down_proj
                (down.weight if hasattr(down, "weight") else down).mul_(scale)
            if hasattr(mlp, "shared_experts"):
                mlp.shared_experts.down_proj.weight.mul_(scale)
        if lever.norm_scale != 1.0:
            layer.input_layernorm.weight.mul_(lever.norm_scale)
            layer.post_attention_layernorm.weight.mul_(lever.norm_scale)


@torch.no_grad()
def boundary_stats(model: torch.nn.Module, lang: Language, seed: int) -> dict[str, list[float]]:
    """Per adjacent pair (k, k+1): median ||h_{k+1}-h_k|| / ||h_{k+1}||, median cosine, and
    the same two after removing each boundary's mean over tokens (a constant component is
    only a bias to fc, so the centred figures say what a shifted slot changes per token)."""
    seqs = sample_batch(lang, 16, 64, torch.Generator().manual_seed(seed + 5)).tolist()
    b = torch.cat([target_features(model, s).boundaries for s in seqs], 1)  # [N+1, S*T, H]
    c = b - b.mean(1, keepdim=True)
    out: dict[str, list[float]] = {"rel": [], "cos": [], "rel_centred": [], "cos_centred": [], "norm": []}
    for k in range(b.shape[0] - 1):
        for key, x in (("", b), ("_centred", c)):
            rel = (x[k + 1] - x[k]).norm(dim=-1) / x[k + 1].norm(dim=-1)
            cos = F.cosine_similarity(x[k + 1], x[k], dim=-1)
            out["rel" + key].append(round(rel.median().item(), 4))
            out["cos" + key].append(round(cos.median().item(), 4))
        out["norm"].append(round(b[k + 1].norm(dim=-1).median().item(), 3))
    return out


@torch.no_grad()
def continuation_stats(target: torch.nn.Module, lang: Language, seed: int) -> dict[str, float]:
    """Is the target's greedy text degenerate? Distinct-4-gram ratio of the 48 generated
    tokens, and the fraction whose last 24 tokens repeat with a period <= 12, for the
    target's greedy continuations and for the language's own samples of the same length."""
    g = torch.Generator().manual_seed(seed + 21)
    gen = regenerate(target, lang, 64, REGEN_PROMPT_LEN, 64, g)[:, REGEN_PROMPT_LEN:].tolist()
    ref = sample_batch(lang, 64, 64, torch.Generator().manual_seed(seed + 22))[:, REGEN_PROMPT_LEN:].tolist()
    out: dict[str, float] = {}
    for name, rows in (("greedy", gen), ("language", ref)):
        grams = [len({tuple(r[i:i + 4]) for i in range(len(r) - 3)}) / (len(r) - 3) for r in rows]
        out[f"{name}_distinct4"] = sum(grams) / len(grams)
        out[f"{name}_periodic"] = sum(is_periodic(r[-24:]) for r in rows) / len(rows)
    return out


def run_target_only(lever: Lever, size: Size, seed: int = 0,
                    log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train the lever's target and report its accuracy and `continuation_stats` only."""
    torch.manual_seed(seed)
    lang = make_language(seed)
    target = build_target({**target_config_dict(vocab_size=lang.vocab_size), **lever.config}, seed)
    apply_lever(target, lever)
    loss, acc = train_target_model(target, lang, seed, size.target_steps, decorrelate=lever.decorrelate)
    stats = continuation_stats(target, lang, seed)
    log(f"[{lever.name}] target loss {loss:.4f} held-out acc {acc:.4f} continuations {stats}")
    return {"lever": asdict(lever), "target_loss": loss, "target_heldout_acc": acc, "continuations": stats}


def run_lever(lever: Lever, size: Size, drafts: list[str], seed: int = 0,
              log: Callable[[str], None] = print) -> dict[str, Any]:
    t0 = time.time()
    torch.manual_seed(seed)
    lang = make_language(seed)
    cfg = {**target_config_dict(vocab_size=lang.vocab_size), **lever.config}
    target = build_target(cfg, seed)
    apply_lever(target, lever)
    loss, acc = train_target_model(target, lang, seed, size.target_steps, decorrelate=lever.decorrelate)
    log(f"[{lever.name}] target loss {loss:.4f} held-out acc {acc:.4f} ({time.time() - t0:.0f}s)")
    stats = boundary_stats(target, lang, seed)
    log(f"[{lever.name}] rel {stats['rel']} cos {stats['cos']}")
    log(f"[{lever.name}] rel_centred {stats['rel_centred']} cos_centred {stats['cos_centred']}")
    n = target.config.num_hidden_layers
    hidden = target.config.hidden_size
    train_seqs, held_seqs, d2t, t2d, prompts = draft_data(
        target, lang, seed, size.train_sequences, size.heldout_sequences, size.heldout_prompts)
    result: dict[str, Any] = {"lever": asdict(lever), "size": asdict(size), "target_loss": loss,
                              "target_heldout_acc": acc, "boundaries": stats, "drafts": {}}
    for i, recipe in enumerate(r for r in draft_recipes(n) if r.name in drafts):
        dcfg, dt = train_recipe_draft(target, recipe, seed + 100 + i, size.draft_epochs,
                                      train_seqs, held_seqs, d2t, t2d)
        rows: dict[str, Any] = {}
        for w in wirings(recipe.boundaries, n, dcfg.num_aux * hidden, hidden):
            if w.name not in (SERVED, "slots_minus_one", "slots_plus_one"):
                continue
            traces = per_prompt_acceptance(target, dt.draft, w, prompts, NUM_DRAFT_TOKENS,
                                           size.continuation_len)
            rows[w.name] = {"boundaries": list(w.boundaries),
                            "acceptance_length": mean_acceptance_length(traces)}
        served = rows[SERVED]["acceptance_length"]
        for r in rows.values():
            r["loss"] = 1 - r["acceptance_length"] / served
        result["drafts"][recipe.name] = {"boundaries": list(recipe.boundaries),
                                         "acc_k": [round(a, 4) for a in dt.acc_k], "wirings": rows}
        log(f"[{lever.name}] {recipe.name} acc_k {[round(a, 3) for a in dt.acc_k]} "
            + "; ".join(f"{k} {v['boundaries']} {v['acceptance_length']:.3f} ({v['loss']:+.1%})"
                        for k, v in rows.items()) + f" ({time.time() - t0:.0f}s)")
    result["seconds"] = time.time() - t0
    return result


def table_markdown(results: list[dict[str, Any]]) -> str:
    """One row per (lever, draft): the figures docs/research/bundle_levers.md reports."""
    lines = ["| lever | target acc | adjacent rel dist (median, pairs 1-2..7-8) | cos (centred) | draft | "
             "acc_k (TTT 0..6) | tau served (k=4) | -1 | +1 |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        st = r["boundaries"]
        rel = sorted(st["rel"][1:])[len(st["rel"][1:]) // 2]
        cos = sorted(st["cos_centred"][1:])[len(st["cos_centred"][1:]) // 2]
        for name, d in r["drafts"].items():
            w = d["wirings"]
            cells = [f"{w[k]['acceptance_length']:.2f} ({w[k]['loss']:+.1%})" if k in w else "-"
                     for k in ("slots_minus_one", "slots_plus_one")]
            lines.append(f"| {r['lever']['name']} | {r['target_heldout_acc']:.3f} | {rel:.2f} | {cos:.3f} | "
                         f"{name} {d['boundaries']} | {', '.join(f'{a:.2f}' for a in d['acc_k'])} | "
                         f"{w[SERVED]['acceptance_length']:.2f} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--levers", nargs="+", default=["baseline", "oscale4", "oscale16"])
    p.add_argument("--drafts", nargs="+", default=["specforge-default", "single-aux"])
    p.add_argument("--target-steps", type=int, default=Size.target_steps)
    p.add_argument("--train-sequences", type=int, default=Size.train_sequences)
    p.add_argument("--draft-epochs", type=int, default=Size.draft_epochs)
    p.add_argument("--heldout-prompts", type=int, default=Size.heldout_prompts)
    p.add_argument("--out", type=Path, required=True, help="JSON lines, one per lever (appended)")
    p.add_argument("--target-only", action="store_true",
                   help="train the targets and report accuracy and greedy-text degeneracy only")
    p.add_argument("--table", action="store_true", help="print --out's results as markdown; train nothing")
    a = p.parse_args()
    if a.table:
        print(table_markdown([json.loads(line) for line in a.out.read_text().splitlines() if line]))
        return
    torch.set_num_threads(1)
    size = Size(target_steps=a.target_steps, train_sequences=a.train_sequences,
                draft_epochs=a.draft_epochs, heldout_prompts=a.heldout_prompts)
    for name in a.levers:
        run = run_target_only if a.target_only else run_lever
        kwargs = {} if a.target_only else {"drafts": a.drafts}
        res = run(LEVERS[name], size, log=lambda s: print(s, flush=True), **kwargs)
        with a.out.open("a") as f:
            f.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
