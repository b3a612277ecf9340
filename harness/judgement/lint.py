"""Draft-config lint: what can be known wrong about a draft folder without running an engine.

Every problem found here would otherwise surface as a shape error deep inside an engine, or
worse, as a silently skipped fc or a silently wrong vocabulary map.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from harness.core.boundaries import CONVENTIONS, LayerIdError, ids_to_boundaries, short_boundary
from harness.core.config_schema import draft_config_problems, target_config_problems
from harness.golden.integrity import weights_problem
from harness.models.draft import DRAFT_ARCHITECTURE


@dataclass(frozen=True)
class LintProblem:
    field: str
    message: str  # problem and fix, one line

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def _ids(cfg: dict) -> list[int] | None:
    eagle = cfg.get("eagle_config") or {}
    ids = eagle.get("eagle_aux_hidden_state_layer_ids", cfg.get("eagle_aux_hidden_state_layer_ids"))
    return None if ids is None else list(ids)  # types checked by config_schema first


# the conventions trainers write ids in (DESIGN.md's table: its training rows); the others are
# engines' readings, listed so a user sees what each engine would make of the ids
TRAINING_CONVENTIONS = ("specforge", "eagle3-original", "embedding-minus-one")


def convention_readings(ids: list[int], num_layers: int) -> list[str]:
    """What the ids mean under every known convention (harness.core.boundaries.CONVENTIONS), one
    line per distinct meaning, then the conventions they are not valid under with why: no
    config field says which convention ids are in, so lint says all it could mean."""
    meaning: dict[tuple[int, ...], list[str]] = {}
    invalid: list[str] = []
    for name in CONVENTIONS:
        label = name + (" (trainer)" if name in TRAINING_CONVENTIONS else "")
        try:
            meaning.setdefault(ids_to_boundaries(ids, name, num_layers), []).append(label)
        except LayerIdError as e:
            invalid.append(f"{label} ({str(e).removeprefix(name + ': ').split('; ')[0]})")
    lines = [f"ids {ids} mean boundaries {list(bs)} "
             f"({', '.join(short_boundary(b, num_layers) for b in bs)}) under {', '.join(names)}"
             for bs, names in meaning.items()]
    if invalid:
        lines.append(f"ids {ids} are not valid under: {', '.join(invalid)}")
    return lines


def ids_problem(ids: list[int], convention: str | None, num_layers: int,
                training_boundaries: tuple[int, ...] | None) -> str | None:
    """The one-line problem with the ids, or None. Under a given convention: whether they are
    valid there (and, with the training boundaries known, whether they name them). With no
    convention (a draft on disk, the doctor): an error only where no known convention reads
    them, since ids valid under a trainer's convention ([-1, 3, 5] for "-1 = embedding") are
    a correct config."""
    if convention is not None:
        try:
            bs = ids_to_boundaries(ids, convention, num_layers)
        except LayerIdError as e:
            return str(e)
        if training_boundaries is not None and tuple(bs) != tuple(training_boundaries):
            return (f"{ids} mean boundaries {list(bs)} under {convention}, but training used "
                    f"{list(training_boundaries)}; write the ids training used")
        return None
    reasons = []
    for name in CONVENTIONS:
        try:
            ids_to_boundaries(ids, name, num_layers)
            return None
        except LayerIdError as e:
            reasons.append(str(e))
    return (f"{ids} are valid under no known convention ({'; '.join(reasons[:2])}; ...); write "
            f"the ids in your trainer's convention")


def lint_draft(draft_dir: Path, target_config: dict, convention: str | None = "specforge",
               training_boundaries: tuple[int, ...] | None = None) -> list[LintProblem]:
    """Problems with a draft folder for a target; empty when it is consistent. Never raises:
    a malformed config is a list of one-line problems, not a traceback in a check.
    `convention` None: the ids are an error only if no known convention reads them
    (`ids_problem`); what they mean under each is `convention_readings`."""
    cfg_path, weights_path = draft_dir / "config.json", draft_dir / "model.safetensors"
    if not cfg_path.is_file() or not weights_path.is_file():
        return [LintProblem("files", f"{draft_dir} needs config.json and model.safetensors")]
    try:
        cfg = json.loads(cfg_path.read_text())
        state = load_file(str(weights_path))
    except (json.JSONDecodeError, UnicodeDecodeError, SafetensorError, OSError) as e:
        return [LintProblem("files", f"cannot read the draft ({str(e).splitlines()[0]}); re-export it")]
    schema = [LintProblem(f"target {f}", m) for f, m in target_config_problems(target_config)]
    schema += [LintProblem(f, m) for f, m in draft_config_problems(cfg)]
    weights = weights_problem(state, "model.safetensors")
    if weights:
        schema.append(LintProblem("weights", weights))
    if schema:
        return schema  # the checks below read these fields as typed
    return _lint_consistency(cfg, state, target_config, convention, training_boundaries)


def _lint_consistency(cfg: dict, state: dict[str, torch.Tensor], target_config: dict,
                      convention: str | None, training_boundaries: tuple[int, ...] | None) -> list[LintProblem]:
    problems: list[LintProblem] = []
    add = lambda f, m: problems.append(LintProblem(f, m))  # noqa: E731
    num_layers = int(target_config["num_hidden_layers"])
    target_hidden = int(target_config["hidden_size"])
    vocab = int(target_config["vocab_size"])

    if cfg.get("architectures") != [DRAFT_ARCHITECTURE]:
        add("architectures", f"is {cfg.get('architectures')}, engines dispatch EAGLE-3 on "
                             f"[{DRAFT_ARCHITECTURE!r}]; an EAGLE-3 draft run as EAGLE skips fc")
    ids = _ids(cfg)
    if ids is None:
        add("eagle_aux_hidden_state_layer_ids", "missing; engines then use their default ids, "
                                               "which differ between engines — write the ids training used")
        ids = []
    elif not (cfg.get("eagle_config") or {}).get("use_aux_hidden_state", True):
        add("eagle_config.use_aux_hidden_state", "is false, so engines feed the draft the last "
                                                 "hidden state only; set it true for EAGLE-3")
    problem = ids_problem(ids, convention, num_layers, training_boundaries) if ids else None
    if problem:
        add("eagle_aux_hidden_state_layer_ids", problem)
    if int(cfg.get("target_hidden_size") or cfg["hidden_size"]) != target_hidden:
        add("target_hidden_size", f"is {cfg.get('target_hidden_size')}, the target's hidden size is "
                                  f"{target_hidden}; set it to {target_hidden}")
    hidden = int(cfg["hidden_size"])
    fc = state.get("fc.weight")
    if fc is None:
        add("fc.weight", "missing; an EAGLE-3 draft needs fc over the concatenated aux states")
    elif ids and tuple(fc.shape) != (hidden, len(ids) * target_hidden):
        add("fc.weight", f"has shape {list(fc.shape)}, {len(ids)} ids x {target_hidden} need "
                         f"[{hidden}, {len(ids) * target_hidden}]; the id list or fc is wrong")
    draft_vocab = int(cfg.get("draft_vocab_size", vocab))
    if cfg.get("vocab_size") != vocab:
        add("vocab_size", f"is {cfg.get('vocab_size')}, the target's is {vocab}")
    if draft_vocab > vocab:
        add("draft_vocab_size", f"{draft_vocab} exceeds the target vocab {vocab}")
    head = state.get("lm_head.weight")
    if head is None or head.shape[0] != draft_vocab:
        add("lm_head.weight", f"rows {None if head is None else head.shape[0]} != draft_vocab_size "
                              f"{draft_vocab}")
    problems.extend(_lint_vocab_map(state, draft_vocab, vocab))
    for flag, key in (("norm_before_fc", "input_norm.weight"), ("fc_norm", "fc_norm.0.weight")):
        if bool(cfg.get(flag, False)) != (key in state):
            add(flag, f"config says {bool(cfg.get(flag, False))} but the checkpoint "
                      f"{'has' if key in state else 'lacks'} {key}; engines would ignore or invent a norm")
    return problems


def _lint_vocab_map(state: dict[str, torch.Tensor], draft_vocab: int, vocab: int) -> list[LintProblem]:
    d2t, t2d = state.get("d2t"), state.get("t2d")
    if draft_vocab == vocab and d2t is None:
        return []
    if d2t is None or t2d is None:
        return [LintProblem("d2t/t2d", "a reduced draft vocab needs both d2t (offsets) and t2d (mask)")]
    out = []
    if tuple(d2t.shape) != (draft_vocab,):
        out.append(LintProblem("d2t", f"shape {list(d2t.shape)}, expected [{draft_vocab}]"))
        return out
    if tuple(t2d.shape) != (vocab,) or t2d.dtype != torch.bool:
        out.append(LintProblem("t2d", f"must be a bool mask of shape [{vocab}], got {t2d.dtype} "
                                      f"{list(t2d.shape)}"))
        return out
    targets = torch.arange(draft_vocab) + d2t.long()
    if int(t2d.sum()) != draft_vocab:
        out.append(LintProblem("t2d", f"marks {int(t2d.sum())} ids, draft_vocab_size is {draft_vocab}"))
    if bool((targets < 0).any() or (targets >= vocab).any()):
        out.append(LintProblem("d2t", "i + d2t[i] leaves the target vocab: d2t must hold offsets, "
                                      "not absolute ids (SpecForge layout)"))
    elif not bool(t2d[targets].all()) or not bool((targets[1:] > targets[:-1]).all()):
        out.append(LintProblem("d2t", "i + d2t[i] is not the ascending list of ids t2d marks; "
                                      "d2t and t2d disagree"))
    return out
