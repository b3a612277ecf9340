"""Why the bundle drafts' TTT accuracy is flat, and which language would make it decay (issue #10).

For each variant of the golden language (lexicon size, word lengths) and of the target's
training (steps, decorrelation schedule), train the target and measure what its greedy text
is: the fraction of its word transitions that follow the language's most likely successor
(what a target that learned the second-order table emits), the fraction of tokens that are
no word of the lexicon, and how often it loops. Then, optionally, train drafts on it as the
builder does and measure the per-step TTT accuracy split by how many words lie between the
last position whose target features the draft reads (t) and the token it predicts (t+j+2):
0 (the same word), 1 (the next word, which a target that planned ahead has computed at t) or
2+ (a word the draft must look up itself). Served acceptance as trained and with every slot
one boundary early and late comes from the reference runtime, as in bundle_levers.py.

The figures run anywhere: `--device cuda` trains on a GPU (fast, not bit-reproducible) and
serves on the CPU; the builder's own numbers always come from the CPU.

    PYTHONPATH=. python research/language_variants.py --variants committed w32 \
        --drafts specforge-default --device cuda --out /tmp/variants.jsonl
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from harness.golden.builder import (
    BUILD_SIZES,
    NUM_DRAFT_TOKENS,
    REGEN_PROMPT_LEN,
    BuildSize,
    draft_data,
    draft_recipes,
    train_recipe_draft,
)
from harness.golden.bundle import MANIFEST, sha256_file
from harness.golden.corpus import Language, make_language, manifest_language
from harness.golden.language_stats import text_stats, word_parse
from harness.golden.paths import default_bundle_path
from harness.golden.training import (
    TTT_STEPS,
    bigram_accuracy,
    greedy_loop_fraction,
    regenerate,
    train_target_model,
)
from harness.golden.wirings import SERVED, mean_acceptance_length, per_prompt_acceptance, wirings
from harness.models.draft import Eagle3Draft
from harness.models.target import build_target, load_target, target_config_dict
from research.bundle_levers import boundary_stats
from research.ttt_profile import step_hits


@dataclass(frozen=True)
class Variant:
    """A language (lexicon size, word lengths in tokens) and a target recipe trained on it."""

    name: str
    num_words: int = 96
    word_lengths: tuple[int, int] = (2, 5)
    target_steps: int = 600
    decorrelate: float = 1.0
    decorrelate_start: int = 0
    decorrelate_ramp: int = 0
    lr: float = 3e-3
    lookahead: bool = False  # the next word depends on the two words before the current one

    def language(self, seed: int) -> Language:
        return make_language(seed, num_words=self.num_words, word_lengths=self.word_lengths,
                             lookahead=self.lookahead)


VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("committed"),
    Variant("start25", decorrelate_start=25),
    Variant("steps1500", target_steps=1500, decorrelate_start=25),
    Variant("w48", num_words=48, decorrelate_start=25),
    Variant("w32", num_words=32, decorrelate_start=25),
    Variant("w32-steps1500", num_words=32, target_steps=1500, decorrelate_start=25),
    Variant("w24", num_words=24, decorrelate_start=25),
    Variant("w32-short", num_words=32, word_lengths=(1, 3), decorrelate_start=25),
    Variant("w32-long", num_words=32, word_lengths=(3, 6), decorrelate_start=25),
    Variant("w32-nodecor", num_words=32, decorrelate=0.0),
    Variant("nodecor", decorrelate=0.0),
    Variant("w32-half", num_words=32, decorrelate=0.5, decorrelate_start=25),
    Variant("ahead", lookahead=True, decorrelate_start=25),
    Variant("ahead-nodecor", lookahead=True, decorrelate=0.0),
    Variant("ahead-w48", num_words=48, lookahead=True, decorrelate_start=25),
    Variant("ahead-w48-nodecor", num_words=48, lookahead=True, decorrelate=0.0),
    Variant("ahead-w48-steps1500", num_words=48, lookahead=True, target_steps=1500, decorrelate_start=25),
    Variant("ahead-w64", num_words=64, lookahead=True, decorrelate_start=25),
    Variant("ahead-w64-nodecor", num_words=64, lookahead=True, decorrelate=0.0),
    Variant("ahead-w32", num_words=32, lookahead=True, decorrelate_start=25),
    Variant("ahead-w32-nodecor", num_words=32, lookahead=True, decorrelate=0.0),
    Variant("ahead-w48-half", num_words=48, lookahead=True, decorrelate=0.5, decorrelate_start=25),
    Variant("ahead-w48-ramp100", num_words=48, lookahead=True, decorrelate_ramp=100),
    Variant("ahead-w64-steps1500", num_words=64, lookahead=True, target_steps=1500, decorrelate_start=25),
    Variant("ahead-nodecor-steps1500", lookahead=True, decorrelate=0.0, target_steps=1500),
    Variant("ahead-w48-nodecor-steps1500", num_words=48, lookahead=True, decorrelate=0.0, target_steps=1500),
    Variant("ahead-w0.1", lookahead=True, decorrelate=0.1, decorrelate_start=25),
    Variant("ahead-w0.2", lookahead=True, decorrelate=0.2, decorrelate_start=25),
    Variant("ahead-w48-w0.1", num_words=48, lookahead=True, decorrelate=0.1, decorrelate_start=25),
    Variant("ahead-w48-w0.2", num_words=48, lookahead=True, decorrelate=0.2, decorrelate_start=25),
    Variant("ahead-w64-w0.1", num_words=64, lookahead=True, decorrelate=0.1, decorrelate_start=25),
    Variant("ahead-w48-w0.15", num_words=48, lookahead=True, decorrelate=0.15, decorrelate_start=25),
    Variant("ahead-w48-w0.3", num_words=48, lookahead=True, decorrelate=0.3, decorrelate_start=25),
    Variant("ahead-w48-w0.1-steps1000", num_words=48, lookahead=True, decorrelate=0.1, decorrelate_start=25,
            target_steps=1000),
    Variant("ahead-w32-w0.1", num_words=32, lookahead=True, decorrelate=0.1, decorrelate_start=25),
    Variant("nodecor-steps1500", decorrelate=0.0, target_steps=1500),
    Variant("w0.2", decorrelate=0.2, decorrelate_start=25),
)}


def greedy_text_stats(target: torch.nn.Module, lang: Language, seed: int) -> dict[str, float]:
    """`text_stats` of the target's greedy continuations of 64 language prompts, 160 tokens
    each: how far the text a draft is trained on is from the language."""
    g = torch.Generator().manual_seed(seed + 31)
    rows = regenerate(target, lang, 64, REGEN_PROMPT_LEN, REGEN_PROMPT_LEN + 160, g).tolist()
    return text_stats(rows, lang, REGEN_PROMPT_LEN)


@torch.no_grad()
def accuracy_by_distance(draft: Eagle3Draft, target: torch.nn.Module, seqs: torch.Tensor,
                         boundaries: Sequence[int], lang: Language) -> dict[str, list[float | None]]:
    """Per TTT step, the draft's accuracy against the target's argmax on the generated part of
    `seqs`, split by the number of words between position t and the predicted token t+j+2
    ("0", "1", "2+") and, for word starts, by class ("1:first", "2+:first", ...)."""
    cells: dict[str, list[list[int]]] = {}
    for row in seqs.tolist():
        index, classes, _ = word_parse(row, lang)
        for j, hits in enumerate(step_hits(draft, target, row, boundaries)):
            hit = hits.tolist()
            for t, h in enumerate(hit):
                tok = t + j + 2
                if tok < REGEN_PROMPT_LEN or tok >= len(row) or index[t] is None:
                    continue
                d = index[tok] - index[t]
                dist = "0" if d == 0 else "1" if d == 1 else "2+"
                for key in (dist, f"{dist}:{classes[tok]}"):
                    cell = cells.setdefault(key, [[0, 0] for _ in range(TTT_STEPS)])[j]
                    cell[0] += int(h)
                    cell[1] += 1
    return {k: [round(h / n, 3) if n >= 20 else None for h, n in v] for k, v in sorted(cells.items())}


def run_variant(v: Variant, drafts: Sequence[str], device: str, seed: int = 0,
                size: BuildSize = BUILD_SIZES["full"],
                log: Callable[[str], None] = print) -> dict[str, Any]:
    t0 = time.time()
    torch.manual_seed(seed)
    lang = v.language(seed)
    target = build_target(target_config_dict(vocab_size=lang.vocab_size), seed).to(device)
    loss, acc = train_target_model(target, lang, seed, v.target_steps, lr=v.lr, decorrelate=v.decorrelate,
                                   decorrelate_start=v.decorrelate_start,
                                   decorrelate_ramp=v.decorrelate_ramp)
    target.eval()
    result: dict[str, Any] = {
        "variant": asdict(v), "device": device, "target_loss": round(loss, 4), "target_acc": round(acc, 4),
        "bigram_acc": round(bigram_accuracy(lang, seed), 4),
        "loop_fraction": greedy_loop_fraction(target, lang, seed, REGEN_PROMPT_LEN),
        "greedy": greedy_text_stats(target, lang, seed), "seed": seed,
        "boundaries": boundary_stats(target, lang, seed), "drafts": {}}
    log(f"[{v.name}] target {result['target_loss']} / {result['target_acc']} (bigram "
        f"{result['bigram_acc']}), loops {result['loop_fraction']:.2f}, greedy {result['greedy']}, centred cos "
        f"{result['boundaries']['cos_centred']} "
        f"({time.time() - t0:.0f}s)")
    if not drafts:
        result["seconds"] = round(time.time() - t0)
        return result
    n = target.config.num_hidden_layers
    hidden = target.config.hidden_size
    train_seqs, held_seqs, d2t, t2d, prompts = draft_data(
        target, lang, seed, size.train_sequences, size.heldout_sequences, size.heldout_prompts)
    for i, recipe in enumerate(r for r in draft_recipes(n) if r.name in drafts):
        cfg, dt = train_recipe_draft(target, recipe, seed + 100 + i, size.draft_epochs,
                                     train_seqs, held_seqs, d2t, t2d)
        target.to("cpu")  # nn.Module.to moves in place: the measurements below run on the CPU
        dt.draft.to("cpu")
        by_distance = accuracy_by_distance(dt.draft, target, held_seqs, recipe.boundaries, lang)
        rows: dict[str, Any] = {}
        for w in wirings(recipe.boundaries, n, cfg.num_aux * hidden, hidden):
            if w.name in (SERVED, "slots_minus_one", "slots_plus_one"):
                traces = per_prompt_acceptance(target, dt.draft, w, prompts, NUM_DRAFT_TOKENS,
                                               size.continuation_len)
                rows[w.name] = round(mean_acceptance_length(traces), 4)
        target.to(device)
        served = rows[SERVED]
        result["drafts"][recipe.name] = {
            "acc_k": [round(a, 4) for a in dt.acc_k], "served": served,
            "shift_cost": {k: round(1 - x / served, 4) for k, x in rows.items() if k != SERVED},
            "acc_by_distance": by_distance}
        log(f"[{v.name}] {recipe.name} acc_k {[round(a, 3) for a in dt.acc_k]} served {served:.3f} "
            f"cost {result['drafts'][recipe.name]['shift_cost']} by distance "
            f"{ {k: by_distance[k] for k in ('0', '1', '2+') if k in by_distance} } ({time.time() - t0:.0f}s)")
    result["seconds"] = round(time.time() - t0)
    return result


def run_committed(drafts: Sequence[str], log: Callable[[str], None] = print) -> dict[str, Any]:
    """`text_stats` and `accuracy_by_distance` of the committed bundle's target and drafts, on
    64 fresh greedy continuations of language prompts (the held-out text's kind), on the CPU."""
    bundle = default_bundle_path()
    manifest = json.loads((bundle / "manifest.json").read_text())
    seed = int(manifest["seed"])
    lang = manifest_language(manifest)
    target = load_target(bundle / "target")
    seqs = regenerate(target, lang, 64, REGEN_PROMPT_LEN, 64, torch.Generator().manual_seed(seed + 41))
    result: dict[str, Any] = {"bundle_manifest": sha256_file(bundle / MANIFEST)[:16],
                              "greedy": greedy_text_stats(target, lang, seed), "drafts": {}}
    log(f"[committed bundle] greedy {result['greedy']}")
    for name in drafts:
        meta = manifest["drafts"][name]
        draft = Eagle3Draft.load(bundle / meta["folder"])
        # the drafts train with a frozen copy of the target's embeddings, so this is what they
        # hold where they store any; where they store none, it is what every engine shares them
        draft.embed_tokens.weight.data.copy_(target.model.embed_tokens.weight.data)
        by_distance = accuracy_by_distance(draft, target, seqs, meta["boundaries"], lang)
        result["drafts"][name] = {"acc_k": meta["acc_k"], "acc_by_distance": by_distance}
        log(f"[committed bundle] {name} by distance {by_distance}")
    return result


def _schedule(v: dict[str, Any]) -> str:
    if v["decorrelate_ramp"]:
        return f"ramp {v['decorrelate_ramp']}"
    return f"from {v['decorrelate_start']}"


def table_markdown(results: Sequence[dict[str, Any]]) -> str:
    """One row per (variant, draft): the figures docs/research/bundle_levers.md reports."""
    lines = ["| variant | seed | words, lengths, lookahead | steps, penalty (start) | target acc (bigram) | "
             "follows table | loops | draft | acc_k (TTT 0..6) | served | -1 | +1 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        v = r["variant"]
        for name, d in r["drafts"].items():
            cost = d["shift_cost"]
            lines.append(
                f"| {v['name']} | {r.get('seed', 0)} | {v['num_words']}, {v['word_lengths'][0]}-{v['word_lengths'][1]}, "
                f"{'yes' if v['lookahead'] else 'no'} | {v['target_steps']}, {v['decorrelate']:g} "
                f"({_schedule(v)}) | "
                f"{r['target_acc']:.3f} ({r['bigram_acc']:.3f}) | {r['greedy']['follows_table']:.1%} | "
                f"{r['loop_fraction']:.0%} | {name} | {', '.join(f'{a:.2f}' for a in d['acc_k'])} | "
                f"{d['served']:.2f} | {cost['slots_minus_one']:.1%} | {cost['slots_plus_one']:.1%} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", nargs="+", default=["committed", "w32"], choices=sorted(VARIANTS))
    p.add_argument("--drafts", nargs="*", default=["specforge-default"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--smoke", action="store_true", help="3 target steps and the smoke build's draft size")
    p.add_argument("--out", type=Path, required=True, help="JSON lines, one per variant (appended)")
    p.add_argument("--table", action="store_true", help="print --out's results as markdown; train nothing")
    p.add_argument("--committed", action="store_true",
                   help="measure the committed bundle's target and --drafts instead of training variants")
    a = p.parse_args()
    if a.table:
        print(table_markdown([json.loads(line) for line in a.out.read_text().splitlines() if line]))
        return
    torch.set_num_threads(a.threads)
    if a.committed:
        a.out.write_text(json.dumps(run_committed(a.drafts, log=lambda s: print(s, flush=True)), indent=1) + "\n")
        return
    size = BUILD_SIZES["smoke" if a.smoke else "full"]
    for name in a.variants:
        v = replace(VARIANTS[name], target_steps=3) if a.smoke else VARIANTS[name]
        res = run_variant(v, a.drafts, a.device, a.seed, size, log=lambda s: print(s, flush=True))
        with a.out.open("a") as f:
            f.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
