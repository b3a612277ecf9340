"""Strict shape of the two configs the suite reads: an EAGLE-3 draft's config.json and its
target's. Types, ranges and empty lists are checked here, once, so that nothing downstream
calls `int()` on a float (which silently truncates 1.5 to 1) or on a string (a raw ValueError
that would surface as a check's message).

Each problem is `(field, message)`, the message one line naming what is wrong and the fix.
The draft lint reports them; bundle loading refuses a bundle whose configs have any.
"""

from __future__ import annotations

from typing import Any

Problem = tuple[str, str]

_DRAFT_INTS = ("hidden_size", "vocab_size", "num_attention_heads", "intermediate_size")
_DRAFT_OPTIONAL_INTS = ("draft_vocab_size", "target_hidden_size", "num_key_value_heads",
                        "head_dim", "max_position_embeddings")
_DRAFT_OPTIONAL_FLOATS = ("rms_norm_eps", "rope_theta")
_DRAFT_OPTIONAL_BOOLS = ("norm_before_fc", "fc_norm")
_TARGET_INTS = ("num_hidden_layers", "hidden_size", "vocab_size")
IDS = "eagle_aux_hidden_state_layer_ids"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _positive_int(cfg: dict, key: str, required: bool) -> Problem | None:
    if key not in cfg or cfg[key] is None:
        return (key, "missing; write the model's value") if required else None
    v = cfg[key]
    if not _is_int(v) or v < 1:
        return key, f"is {v!r}, must be a positive integer; write the model's value"
    return None


def layer_ids_problem(ids: Any, where: str) -> Problem | None:
    """The id list itself: a non-empty list of distinct integers (ranges depend on the
    convention and are checked by `harness.core.boundaries`)."""
    if not isinstance(ids, list):
        return where, f"is {ids!r}, must be a list of integer layer ids, e.g. [1, 3, 4]"
    if not ids:
        return where, "is empty; an EAGLE-3 draft needs the ids of the aux layers training used"
    bad = [i for i in ids if not _is_int(i)]
    if bad:
        return where, (f"holds {bad[0]!r}, not an integer (ids are layer indices; a float would "
                       f"be truncated); write the integer ids training used")
    if len(set(ids)) != len(ids):
        return where, f"repeats an id ({ids}); each aux slot needs its own layer"
    return None


def draft_config_problems(cfg: Any) -> list[Problem]:
    if not isinstance(cfg, dict):
        return [("config.json", f"holds a JSON {type(cfg).__name__}, not an object; re-export the draft")]
    out: list[Problem] = []
    for key in _DRAFT_INTS:
        p = _positive_int(cfg, key, required=True)
        if p:
            out.append(p)
    for key in _DRAFT_OPTIONAL_INTS:
        p = _positive_int(cfg, key, required=False)
        if p:
            out.append(p)
    for key in _DRAFT_OPTIONAL_FLOATS:
        v = cfg.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0
                              or v == float("inf")):
            out.append((key, f"is {v!r}, must be a positive finite number"))
    for key in _DRAFT_OPTIONAL_BOOLS:
        if key in cfg and not isinstance(cfg[key], bool):
            out.append((key, f"is {cfg[key]!r}, must be true or false"))
    arch = cfg.get("architectures")
    if arch is not None and not (isinstance(arch, list) and arch and all(isinstance(a, str) for a in arch)):
        out.append(("architectures", f"is {arch!r}, must be a list of class names, e.g. "
                                     f"[\"LlamaForCausalLMEagle3\"]"))
    eagle = cfg.get("eagle_config")
    if eagle is not None and not isinstance(eagle, dict):
        out.append(("eagle_config", f"is {eagle!r}, must be an object holding {IDS}"))
        eagle = None
    eagle = eagle or {}
    if "use_aux_hidden_state" in eagle and not isinstance(eagle["use_aux_hidden_state"], bool):
        out.append(("eagle_config.use_aux_hidden_state",
                    f"is {eagle['use_aux_hidden_state']!r}, must be true or false"))
    for where, holder in ((f"eagle_config.{IDS}", eagle), (IDS, cfg)):
        if IDS in holder:
            p = layer_ids_problem(holder[IDS], where)
            if p:
                out.append(p)
    if not out and cfg.get("head_dim") is None and cfg["hidden_size"] % cfg["num_attention_heads"]:
        out.append(("num_attention_heads", f"{cfg['num_attention_heads']} does not divide "
                                           f"hidden_size {cfg['hidden_size']}; set head_dim"))
    return out


def target_config_problems(cfg: Any) -> list[Problem]:
    if not isinstance(cfg, dict):
        return [("config.json", f"holds a JSON {type(cfg).__name__}, not an object; re-export the target")]
    return [p for p in (_positive_int(cfg, k, required=True) for k in _TARGET_INTS) if p]
