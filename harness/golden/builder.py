"""`eagle3-conformance golden build`: regenerate a bundle from nothing.

corpus -> target -> regenerated draft data -> drafts (TTT) -> pinned-prompt tensors ->
simulated acceptance -> manifest with hashes. CI never runs this (it is minutes of CPU);
it exists so the committed bundle is reproducible and reviewable.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import safetensors
import torch
import transformers
from safetensors.torch import save_file

from harness.golden.bundle import FORMAT_VERSION, MANIFEST, TENSORS, load_bundle, sha256_file
from harness.golden.corpus import PAD, make_language, sample_batch
from harness.golden.features import aux_features, target_features
from harness.golden.training import (
    TTT_STEPS,
    TargetTraining,
    bigram_accuracy,
    predicted_acceptance_length,
    regenerate,
    train_draft,
    train_target,
    ttt_forward,
    vocab_mapping,
)
from harness.golden.wirings import (
    SERVED,
    choose_canary,
    mean_acceptance_length,
    per_prompt_acceptance,
    wirings,
)
from harness.models.draft import DraftConfig, Eagle3Draft
from harness.models.target import load_target
from harness.tolerances import CANARY_FRACTION

NUM_DRAFT_TOKENS = 4
DRAFT_VOCAB_SIZE = 160
PINNED_MAX_LEN = 32
CANARY_PROMPTS = 6  # held-out prompts the canary serves (of BuildSize.heldout_prompts)
CONTINUATION_LEN = 32
REGEN_PROMPT_LEN = 16


@dataclass(frozen=True)
class BuildSize:
    """How much work a build does. `full` is the committed bundle; `smoke` runs every stage
    of the same code on a sliver of the data, so determinism can be tested in seconds."""

    # 600 steps with the decorrelation penalty at weight 1.0 from the first step: the recipe
    # docs/bundle_levers.md measured (a one-boundary shift costs 38-47% of acceptance). Not 900:
    # at 900 steps (a longer cosine schedule) the same penalty stalls the LM loss at 4.77 for
    # good, and ramping the penalty in over 300 steps leaves the boundaries correlated (mean
    # cos^2 0.43) — measured, see docs/bundle_levers.md
    target_steps: int = 600
    target_decorrelation: float = 1.0
    draft_epochs: int = 6
    train_sequences: int = 768
    heldout_sequences: int = 64
    heldout_prompts: int = 24
    pinned_prompts: int = 16
    continuation_len: int = CONTINUATION_LEN
    # refuse a target that learned nothing and drafts whose canary cannot tell wirings apart
    # (a usable bundle); off for `smoke`, whose 3 target steps are not meant to learn
    require_usable: bool = True

    def record(self) -> dict[str, Any]:
        """What the manifest's `build` records: the work done, not the checks made on it."""
        return {k: v for k, v in asdict(self).items() if k != "require_usable"}


BUILD_SIZES: dict[str, BuildSize] = {
    "full": BuildSize(),
    "smoke": BuildSize(target_steps=3, draft_epochs=1, train_sequences=16, heldout_sequences=8,
                       heldout_prompts=2, pinned_prompts=4, continuation_len=4, require_usable=False),
}


def target_problem(accuracy: float, final_loss: float, bigram: float) -> str | None:
    """Why a trained target cannot make a bundle, or None. The decorrelation recipe can stall
    (measured: at 900 steps; and at 600 steps from scratch on a machine other than the one
    that built the committed bundle, loss 4.763 and accuracy 0.042 where the committed target
    reached 1.422 and 0.517): the drafts trained on such a target accept everything under
    every wiring (acc_k 1.0, served 5.000 = every wrong wiring), so the bundle would certify
    nothing, and the build must say so at once instead of writing it."""
    if accuracy > bigram:
        return None
    return (f"the target did not learn the language: held-out next-token accuracy {accuracy:.3f} is "
            f"no better than a bigram table's ({bigram:.3f}; final training loss {final_loss:.3f}), "
            f"so its training stalled. The recipe is sensitive to "
            f"floating-point order across machines: rebuild the drafts on the committed target "
            f"with --target-from golden/tiny-dsv3/target, or try another --seed")


def canary_problem(draft: str, canary: dict[str, Any]) -> str | None:
    """Why a draft's canary cannot be used, or None: served as trained it must accept more
    than under its best wrong wiring, or the canary check could never fail."""
    if canary["served"] > canary["best_wrong"]:
        return None
    return (f"draft {draft}: served as trained it accepts {canary['served']:.3f}, no more than "
            f"under its best wrong wiring ({canary['best_wrong_wiring']}: {canary['best_wrong']:.3f}), "
            f"so the bundle could not tell a wrong wiring from a right one; the target or the "
            f"drafts did not train as the recipe expects")


@dataclass(frozen=True)
class DraftRecipe:
    """A draft to train: ids as written in its config, in `convention`, and what they mean."""

    name: str
    convention: str
    layer_ids: tuple[int, ...]
    boundaries: tuple[int, ...]


def draft_recipes(num_layers: int) -> list[DraftRecipe]:
    n = num_layers
    return [
        # SpecForge default ids [1, N//2-1, N-4]: output of layer k = boundary k+1.
        DraftRecipe("specforge-default", "specforge", (1, n // 2 - 1, n - 4), (2, n // 2, n - 3)),
        # The "-1 = embedding" training style (the motivating Kimi-K2.5 case): first slot is b=0.
        DraftRecipe("embed-first", "embedding-minus-one", (-1, n // 2 - 1, n - 3), (0, n // 2, n - 2)),
        # One aux state: fc input width == hidden width, so "fc skipped on width match" shows.
        DraftRecipe("single-aux", "specforge", (n // 2 - 1,), (n // 2,)),
        # Last slot is the final boundary N (pre-norm output of the last layer): the only draft
        # that tells "final boundary never captured" and "final boundary normed" apart from
        # other bugs, and one whose boundaries differ from vLLM V2's (2, N//2, N-3) fallback.
        DraftRecipe("final-aux", "specforge", (1, n // 2 - 1, n - 1), (2, n // 2, n)),
    ]


Simulator = Callable[[torch.nn.Module, Eagle3Draft, Sequence[int], Sequence[int], int, int],
                     tuple[list[int], list[int]]]


def draft_data(target: torch.nn.Module, lang, seed: int, train_sequences: int, heldout_sequences: int,
               heldout_prompts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                              list[list[int]]]:
    """The drafts' data from a trained target, seeded: regenerated training and held-out
    sequences (corpus prompts continued greedily by the target), the vocab map built from the
    training ones, and the held-out serving prompts. (train, held, d2t, t2d, prompts)."""
    g = torch.Generator().manual_seed(seed + 11)
    train_seqs = regenerate(target, lang, train_sequences, REGEN_PROMPT_LEN, 64, g)
    held_seqs = regenerate(target, lang, heldout_sequences, REGEN_PROMPT_LEN, 64, g)
    d2t, t2d = vocab_mapping(train_seqs, DRAFT_VOCAB_SIZE, lang.vocab_size)
    prompts = sample_batch(lang, heldout_prompts, 24, torch.Generator().manual_seed(seed + 13)).tolist()
    return train_seqs, held_seqs, d2t, t2d, prompts


def _default_simulator() -> Simulator:
    from harness.engines.speculative import simulate_chain

    return simulate_chain


def build_bundle(out: str | Path, seed: int = 0, size: BuildSize = BUILD_SIZES["full"],
                 log: Callable[[str], None] = print,
                 target_from: Path | None = None, threads: int = 1) -> Path:
    """Build into a temp folder and move it into place only when complete and verified.

    `target_from`: a folder holding a target this builder trained earlier with the same seed
    (its `training.json` carries the training figures), to rebuild drafts and tensors
    without minutes of target training. `threads`: torch's intra-op threads, fixed so that
    reductions run in one order (determinism on one machine); 1 also keeps a loaded 2-core
    machine from thrashing. The caller's thread setting is restored afterwards.
    """
    problem = out_problem(Path(out))
    if problem:  # before minutes of training, not after
        raise ValueError(problem)
    before = torch.get_num_threads()
    try:
        return _build(Path(out), seed, size, log, target_from, threads)
    finally:
        torch.set_num_threads(before)


def _build(out: Path, seed: int, size: BuildSize, log: Callable[[str], None],
           target_from: Path | None, threads: int) -> Path:
    target_steps = size.target_steps
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    lang = make_language(seed)
    if target_from is not None:
        log(f"reusing the target trained in {target_from}")
        tt = _reuse_target(Path(target_from), seed, target_steps, size.target_decorrelation)
        tt_threads = json.loads((Path(target_from) / "training.json").read_text()).get("threads", threads)
    else:
        log(f"training target ({target_steps} steps)")
        tt = train_target(lang, seed, steps=target_steps, decorrelate=size.target_decorrelation)
        tt_threads = threads
    log(f"target: final loss {tt.final_loss:.4f}, held-out next-token accuracy {tt.heldout_accuracy:.4f}")
    problem = target_problem(tt.heldout_accuracy, tt.final_loss, bigram_accuracy(lang, seed))
    if size.require_usable and problem:  # before minutes of draft training, not after
        raise ValueError(problem)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".golden-", dir=out.parent))
    try:
        tt.model.save_pretrained(str(tmp / "target"), safe_serialization=True)
        (tmp / "target" / "training.json").write_text(json.dumps(
            {"seed": seed, "steps": target_steps, "decorrelation": size.target_decorrelation,
             "threads": tt_threads, "final_train_loss": tt.final_loss,
             "heldout_next_token_accuracy": tt.heldout_accuracy}, indent=2) + "\n")
        target = load_target(tmp / "target")
        num_layers = target.config.num_hidden_layers
        hidden = target.config.hidden_size
        train_seqs, held_seqs, d2t, t2d, held_prompts = draft_data(
            target, lang, seed, size.train_sequences, size.heldout_sequences, size.heldout_prompts)
        pinned = _pinned_prompts(lang, seed, size.pinned_prompts)
        feats = [target_features(target, p) for p in pinned]
        tensors = _pinned_target_tensors(target, pinned, feats, size.continuation_len)
        tensors["heldout.ids"] = torch.tensor(held_prompts, dtype=torch.long)
        simulate = _default_simulator()
        drafts_meta: dict[str, Any] = {}
        for i, recipe in enumerate(draft_recipes(num_layers)):
            cfg = DraftConfig(vocab_size=lang.vocab_size, draft_vocab_size=DRAFT_VOCAB_SIZE,
                              hidden_size=hidden, target_hidden_size=hidden,
                              aux_layer_ids=recipe.layer_ids, intermediate_size=256)
            log(f"training draft {recipe.name} ids {list(recipe.layer_ids)} "
                f"(boundaries {list(recipe.boundaries)})")
            dt = train_draft(target, cfg, recipe.boundaries, train_seqs, held_seqs, d2t, t2d,
                             seed=seed + 100 + i, epochs=size.draft_epochs, score_from=REGEN_PROMPT_LEN)
            folder = f"draft-{recipe.name}"
            dt.draft.save(tmp / folder)
            draft = Eagle3Draft.load(tmp / folder)
            predicted = predicted_acceptance_length(dt.acc_k, NUM_DRAFT_TOKENS)
            table, canary = _wiring_table(target, draft, recipe, held_prompts, size.continuation_len)
            measured = table[SERVED]["acceptance_length"]
            log(f"  acc_k {[round(a, 3) for a in dt.acc_k]}; acceptance length predicted "
                f"{predicted:.3f}, measured {measured:.3f} (k={NUM_DRAFT_TOKENS})")
            for name, row in table.items():
                if name != SERVED:
                    log(f"    {name:18s} {row['boundaries']} -> {row['acceptance_length']:.3f} "
                        f"({row['loss']:+.1%})")
            log(f"  canary: prompts {list(canary['prompts'])} served {canary['served']:.3f}, best "
                f"wrong {canary['best_wrong']:.3f} ({canary['best_wrong_wiring']}), threshold "
                f"{canary['threshold']:.3f}")
            problem = canary_problem(recipe.name, canary)
            if size.require_usable and problem:
                raise ValueError(problem)
            tensors.update(_pinned_draft_tensors(recipe, target, draft, pinned, feats, simulate,
                                                 size.continuation_len))
            drafts_meta[recipe.name] = {
                "folder": folder, "convention": recipe.convention,
                "layer_ids": list(recipe.layer_ids), "boundaries": list(recipe.boundaries),
                "ttt_steps": TTT_STEPS, "acc_k": [round(a, 6) for a in dt.acc_k],
                "final_train_loss": round(dt.final_loss, 6),
                "num_draft_tokens": NUM_DRAFT_TOKENS,
                "predicted_acceptance_length": round(predicted, 6),
                "measured_acceptance_length": round(measured, 6),
                "wirings": table,
                "canary": canary,
                "draft_vocab_size": DRAFT_VOCAB_SIZE,
                "norm_before_fc": cfg.norm_before_fc, "fc_norm": cfg.fc_norm,
            }
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / TENSORS),
                  metadata={"format_version": str(FORMAT_VERSION)})
        manifest = {
            "format_version": FORMAT_VERSION,
            "name": out.name,
            "seed": seed,
            "description": "tiny DeepSeek-V3 (MLA + MoE) target on a synthetic language and "
                           "EAGLE-3 drafts trained with TTT in SpecForge's layout",
            "target": {
                "folder": "target", "architecture": "DeepseekV3ForCausalLM",
                "num_layers": num_layers, "hidden_size": hidden, "vocab_size": lang.vocab_size,
                "train_steps": target_steps, "final_train_loss": round(tt.final_loss, 6),
                "decorrelation_penalty": size.target_decorrelation,
                "heldout_next_token_accuracy": round(tt.heldout_accuracy, 6),
            },
            "drafts": drafts_meta,
            "prompts": {"count": len(pinned), "max_len": PINNED_MAX_LEN,
                        "continuation_len": size.continuation_len, "pad_token_id": PAD},
            "heldout": {"prompts": len(held_prompts), "prompt_len": 24,
                        "max_new_tokens": size.continuation_len},
            "build": size.record(),
            "threads": threads,
            "target_threads": tt_threads,
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "safetensors": safetensors.__version__,
                         "python": platform.python_version()},
        }
        manifest["files"] = {
            str(p.relative_to(tmp)): sha256_file(p)
            for p in sorted(tmp.rglob("*")) if p.is_file() and p.name != MANIFEST
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        load_bundle(tmp)
        problem = out_problem(out)  # again: the folder may have changed while we trained
        if problem:
            raise ValueError(problem)
        if out.exists():
            shutil.rmtree(out)  # an empty folder or a bundle this builder wrote: nothing else
        shutil.move(str(tmp), str(out))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"bundle written to {out}")
    return out


def is_built_bundle(folder: Path) -> bool:
    """A folder this builder wrote: its manifest carries the builder's `build` record and
    lists every file in it (so replacing it deletes nothing a user put there)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        listed = set(manifest["files"]) | {MANIFEST}
        build = manifest["build"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    present = {str(p.relative_to(folder)) for p in folder.rglob("*") if not p.is_dir()}
    return isinstance(build, dict) and present <= listed


def out_problem(out: Path) -> str | None:
    """Why `golden build --out` must not write to `out`, or None. The builder replaces only
    what it created: nothing, an empty folder, or a bundle it built."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        return f"--out {out} exists and is not a folder; pass a new or empty folder"
    if out.is_dir() and any(out.iterdir()) and not is_built_bundle(out):
        return (f"--out {out} is a non-empty folder that is not a bundle this builder wrote; "
                f"pass a new or empty folder (nothing is deleted)")
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        return f"--out {out}: cannot create it under {parent}; pass a writable location"
    return None


def _reuse_target(folder: Path, seed: int, steps: int, decorrelation: float) -> TargetTraining:
    stats = json.loads((folder / "training.json").read_text())
    got = (stats.get("seed"), stats.get("steps"), stats.get("decorrelation", 0.0))
    if got != (seed, steps, decorrelation):
        raise ValueError(f"{folder} was trained with seed {got[0]} for {got[1]} steps at "
                         f"decorrelation {got[2]}, not seed {seed} for {steps} at {decorrelation}; "
                         f"retrain")
    return TargetTraining(load_target(folder), float(stats["final_train_loss"]),
                          float(stats["heldout_next_token_accuracy"]))


def _pinned_prompts(lang, seed: int, count: int) -> list[list[int]]:
    """Ragged lengths 1..PINNED_MAX_LEN, so every check sees edge lengths and padding."""
    g = torch.Generator().manual_seed(seed + 17)
    full = sample_batch(lang, count, PINNED_MAX_LEN, g).tolist()
    lengths = ([1, 2, PINNED_MAX_LEN] + torch.randint(
        3, PINNED_MAX_LEN, (max(0, count - 3),), generator=g).tolist())[:count]
    return [row[:n] for row, n in zip(full, lengths, strict=True)]


def _pad(rows: Sequence[torch.Tensor], length: int, fill: float = 0) -> torch.Tensor:
    """Stack [T, ...] tensors padded with `fill` along T to `length`."""
    out = torch.full((len(rows), length, *rows[0].shape[1:]), fill, dtype=rows[0].dtype)
    for i, r in enumerate(rows):
        out[i, : r.shape[0]] = r
    return out


@torch.no_grad()
def _pinned_target_tensors(target, pinned, feats, continuation_len: int) -> dict[str, torch.Tensor]:
    ids = torch.full((len(pinned), PINNED_MAX_LEN), PAD, dtype=torch.long)
    for i, p in enumerate(pinned):
        ids[i, : len(p)] = torch.tensor(p)
    conts = []
    for p in pinned:
        x = torch.tensor([p])
        y = target.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False,
                            max_new_tokens=continuation_len, min_new_tokens=continuation_len,
                            pad_token_id=PAD)
        conts.append(y[0, len(p):])
    return {
        "prompts.ids": ids,
        "prompts.lengths": torch.tensor([len(p) for p in pinned]),
        "boundaries": _pad([f.boundaries.transpose(0, 1) for f in feats], PINNED_MAX_LEN).transpose(1, 2).contiguous(),
        "final_normed": _pad([f.final_normed for f in feats], PINNED_MAX_LEN),
        "mlp_out": _pad([f.mlp_out.transpose(0, 1) for f in feats], PINNED_MAX_LEN).transpose(1, 2).contiguous(),
        "continuations": torch.stack(conts),
    }


@torch.no_grad()
def _pinned_draft_tensors(recipe: DraftRecipe, target, draft: Eagle3Draft, pinned, feats,
                          simulate: Simulator, continuation_len: int) -> dict[str, torch.Tensor]:
    aux = [aux_features(f, recipe.boundaries) for f in feats]
    fc = [draft.project(a) for a in aux]
    steps = []
    for p, a, f in zip(pinned, aux, feats, strict=True):
        assert f.logits is not None, "the builder computes features, never reads them"
        labels = f.logits.argmax(-1)
        _, _, preds = ttt_forward(draft, torch.tensor([p]), a[None], labels[None])
        grid = torch.full((len(p), TTT_STEPS), -1, dtype=torch.long)
        for j, pr in enumerate(preds):
            grid[: pr.shape[1], j] = draft.to_target_ids(pr[0])
        steps.append(grid)
    traces = [simulate(target, draft, p, recipe.boundaries, NUM_DRAFT_TOKENS, continuation_len)[1]
              for p in pinned]
    width = max(len(t) for t in traces)
    trace = torch.full((len(pinned), width), -1, dtype=torch.long)
    for i, t in enumerate(traces):
        trace[i, : len(t)] = torch.tensor(t, dtype=torch.long)
    name = recipe.name
    return {
        f"{name}.aux": _pad(aux, PINNED_MAX_LEN),
        f"{name}.fc": _pad(fc, PINNED_MAX_LEN),
        f"{name}.draft_tokens": _pad(steps, PINNED_MAX_LEN, fill=-1),
        f"{name}.accept_trace": trace,
    }


def _wiring_table(target, draft: Eagle3Draft, recipe: DraftRecipe, prompts, continuation_len: int,
                  ) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Held-out acceptance served as trained and under every wrong wiring of
    `harness.golden.wirings` (loss: relative drop of the mean acceptance length), and the
    canary chosen from the same per-prompt traces."""
    cfg = draft.cfg
    traces: dict[str, list[list[int]]] = {}
    table: dict[str, dict[str, Any]] = {}
    for w in wirings(recipe.boundaries, target.config.num_hidden_layers, cfg.num_aux * cfg.target_hidden_size,
                     cfg.hidden_size):
        traces[w.name] = per_prompt_acceptance(target, draft, w, prompts, NUM_DRAFT_TOKENS, continuation_len)
        table[w.name] = {"boundaries": list(w.boundaries), "what": w.what,
                         "acceptance_length": round(mean_acceptance_length(traces[w.name]), 6)}
    served = table[SERVED]["acceptance_length"]
    for row in table.values():
        row["loss"] = round(1 - row["acceptance_length"] / served, 6)
    c = choose_canary(traces, min(CANARY_PROMPTS, len(prompts)), CANARY_FRACTION)
    canary = {"prompts": list(c.prompts), "served": round(c.served, 6), "best_wrong": round(c.best_wrong, 6),
              "best_wrong_wiring": c.best_wrong_wiring, "fraction": CANARY_FRACTION,
              "threshold": round(c.threshold, 6)}
    return table, canary
