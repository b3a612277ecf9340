"""An engine's layer-id convention as measured: from every draft config it was served, the rule
it actually applied, and which trainers' drafts it therefore serves as trained.

No config field says which convention a draft's ids are in, and every engine's *default*
lands on the same boundaries {2, N//2, N-3}, so an engine's reading of ids only shows on
explicit id lists, and differs by config layout (which key it reads). The layer-id check
records one `Observation` per (layout, ids) it served: the boundary each engine slot held
(the fingerprint's labels) or the crash. `infer` turns them into statements a user can act on:
b = id, b = id + 1, SGLang deepseek_v2's "+1 only if the first id is 1" (sgl-project/sglang
PR #25454), or defaults regardless of ids; slots in config or ascending order; which ids
crash and how. Every statement is only as strong as the lists served: a rule that several
candidates explain is reported with all of them, and an order no unsorted list tested is
"not determined".

Pure data in, plain dicts out (report.json's `observed_convention` key), so the report and
the conformance table render it without importing torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from harness.core.boundaries import (
    Convention,
    LayerIdError,
    boundaries_to_ids,
    get_convention,
    ids_to_boundaries,
)

# Trainers whose id conventions a draft may carry (harness.core.boundaries.CONVENTIONS keys).
TRAINERS = ("specforge", "eagle3-original", "embedding-minus-one")

Label = int | str | None


@dataclass(frozen=True)
class Observation:
    """One draft config served: what each engine slot held (`slots`, fingerprint labels in
    engine slot order) or the engine's failure (`crash`, its first line)."""

    layout: str
    ids: tuple[int, ...]
    num_layers: int
    slots: tuple[Label, ...] | None = None
    crash: str | None = None
    told: str | None = None  # the training convention the engine was told (reference engines)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["ids"] = list(self.ids)
        out["slots"] = None if self.slots is None else list(self.slots)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Observation:
        slots = data.get("slots")
        return cls(layout=str(data["layout"]), ids=tuple(int(i) for i in data["ids"]),
                   num_layers=int(data["num_layers"]),
                   slots=None if slots is None else tuple(slots),
                   crash=data.get("crash"), told=data.get("told"))


def _plus_one_if_first_is_one(ids: Sequence[int]) -> list[int]:
    return [i + 1 for i in ids] if ids and ids[0] == 1 else list(ids)


# Candidate rules (id list -> boundaries in config order), simplest first.
RULES: dict[str, Callable[[Sequence[int]], list[int]]] = {
    "b = id": lambda ids: list(ids),
    "b = id + 1": lambda ids: [i + 1 for i in ids],
    "b = id + 1 only if the first id is 1, else b = id (SGLang deepseek_v2, PR #25454)":
        _plus_one_if_first_is_one,
}
ORDERS: dict[str, Callable[[list[int]], list[int]]] = {
    "config order": lambda bs: bs,
    "ascending": sorted,
}
DEFAULTS = "defaults regardless of ids"


def _defaults(n: int) -> list[int]:
    return list(get_convention("vllm").default_boundaries(n))


def _explains(rule: str, order: str, obs: Observation) -> bool:
    assert obs.slots is not None
    return list(obs.slots) == ORDERS[order](RULES[rule](obs.ids))


def _trainer_verdict(trainer: str, served: list[Observation]) -> dict[str, Any]:
    """Measured: on every served list this trainer can write, did the slots hold what it means?"""
    checked, wrong = 0, []
    for obs in served:
        try:
            meant = list(ids_to_boundaries(obs.ids, trainer, obs.num_layers))
        except LayerIdError:
            continue  # this trainer never writes that list
        checked += 1
        if obs.crash is not None:
            wrong.append(f"ids {list(obs.ids)} crash ({obs.crash})")
        elif list(obs.slots or ()) != meant:
            wrong.append(f"ids {list(obs.ids)} -> slots {list(obs.slots or ())}, trained {meant}")
    shown = "; ".join(wrong[:3]) + (f"; {len(wrong) - 3} more" if len(wrong) > 3 else "")
    verdict = ("not measured (no served list is one this trainer writes)" if not checked
               else f"served as trained on all {checked} list(s)" if not wrong
               else f"misfed on {len(wrong)} of {checked} list(s): {shown}")
    return {"served_correctly": bool(checked) and not wrong, "lists_checked": checked,
            "verdict": verdict}


# Which trainer's ids each rule reads as trained (harness.core.boundaries conventions).
_RULE_SERVES = {"b = id": {"eagle3-original": ""},
                "b = id + 1": {"specforge": "", "embedding-minus-one": ""}}


def _serves(rule: str, order: str, crashes: list[dict[str, Any]]) -> dict[str, str]:
    """From the inferred rule: which trainers' drafts it serves as trained, and when."""
    caveats = []
    if order == "ascending":
        caveats.append("only when the ids are listed in ascending order (slots are re-sorted)")
    if crashes:
        caveats.append("never with the lists that crash (" + "; ".join(
            str(c["ids"]) for c in crashes[:4]) + ("; ..." if len(crashes) > 4 else "") + ")")
    tail = ("; " + "; ".join(caveats)) if caveats else ""
    out = {}
    for t in TRAINERS:
        if rule in _RULE_SERVES:
            hit = _RULE_SERVES[rule].get(t)
            out[t] = (f"yes{hit}{tail}" if hit is not None else
                      "no: every slot is " + ("one boundary early" if rule == "b = id" else
                                              "one boundary late"))
        elif "PR #25454" in rule:
            out[t] = {"eagle3-original": "only when the first id is not 1",
                      "specforge": "only when the first id is 1",
                      "embedding-minus-one": "only when the first id is 1"}[t] + tail
        elif rule == DEFAULTS:
            out[t] = "only drafts trained on the default boundaries (2, N//2, N-3)"
        else:
            out[t] = "not determined"
    return out


def _grouped_crashes(observations: Sequence[Observation]) -> list[dict[str, Any]]:
    """One entry per distinct error, with every id list that raised it."""
    by_error: dict[str, list[list[int]]] = {}
    for o in sorted(observations, key=lambda o: (len(o.ids), o.ids)):
        if o.crash is not None:
            by_error.setdefault(o.crash, []).append(list(o.ids))
    return [{"ids": ids[0], "all_ids": ids, "error": error} for error, ids in by_error.items()]


def infer_layout(observations: Sequence[Observation]) -> dict[str, Any]:
    """The rule one layout's observations support (see the module docstring)."""
    read = [o for o in observations if o.crash is None and o.slots is not None]
    crashes = _grouped_crashes(observations)
    clean = [o for o in read if all(isinstance(s, int) for s in o.slots or ())]
    other = [o for o in read if o not in clean]
    fits = [(r, od) for r in RULES for od in ORDERS if clean and all(_explains(r, od, o) for o in clean)]
    defaults_only = bool(clean) and all(list(o.slots or ()) == _defaults(o.num_layers) for o in clean)
    explaining_ids = [o for o in clean if any(list(o.slots or ()) == ORDERS[od](RULES[r](o.ids))
                                             for r in RULES for od in ORDERS)]
    rules = list(dict.fromkeys(r for r, _ in fits))
    orders = list(dict.fromkeys(od for _, od in fits))
    if defaults_only and not fits:
        rule, reads_ids = DEFAULTS, False
    elif rules:
        rule, reads_ids = rules[0], True
    elif not clean:
        rule, reads_ids = "not determined (no list was captured cleanly)", None
    else:
        rule, reads_ids = "no single rule explains the lists served", bool(explaining_ids)
    if not orders:
        order = "not determined"
    elif len(orders) == 1:
        order = orders[0]
    else:
        order = "not determined (every list served was ascending)"
    unsorted = any(list(o.ids) != sorted(o.ids) for o in clean)
    return {
        "rule": rule,
        "also_consistent": rules[1:],
        "reads_ids": reads_ids,
        "slot_order": order,
        "unsorted_lists_served": unsorted,
        "lists": [{"ids": list(o.ids), "slots": list(o.slots or ()), "crash": o.crash}
                  for o in sorted(observations, key=lambda o: (len(o.ids), o.ids))],
        "crashes": crashes,
        "unexplained": [{"ids": list(o.ids), "slots": list(o.slots or ())} for o in other],
        "trainers": {t: _trainer_verdict(t, list(observations)) for t in TRAINERS},
        "serves": _serves(rule, order, crashes),
    }


def infer(observations: Iterable[Observation], fixes: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """report.json's `observed_convention`: per config layout read (and, for engines that honour
    a convention they are told, per told convention), the inferred rule; `fixes`: each
    suggested id list re-served, with "fix verified" / "fix fails: <why>" / "no fix: <why>"."""
    groups: dict[str, list[Observation]] = {}
    for o in observations:
        key = o.layout if o.told is None else f"{o.layout}, told {o.told}"
        groups.setdefault(key, []).append(o)
    layouts = {key: infer_layout(obs) for key, obs in sorted(groups.items())}
    return {"layouts": layouts,
            "formats_read": sorted(k for k, v in layouts.items() if v["reads_ids"]),
            "fixes": [dict(f) for f in fixes]}


def trained_as(convention: str | Convention) -> Convention:
    """The trainer an engine's rule claims to serve: its id rule, slots in config order (trainers
    keep list order) and every boundary capturable (a trainer that hooks the target's layers
    reaches them all). vLLM's b = id claims drafts trained the original EAGLE-3 way."""
    conv = get_convention(convention)
    return replace(conv, name=f"{conv.name} as trained", sorts_ids=False, capture_embedding=True,
                   capture_final=True)


def literal_ids(boundaries: Sequence[int], convention: str | Convention, num_layers: int) -> tuple[int, ...]:
    """The ids that name these boundaries under the engine's rule ignoring what it can capture:
    what a user would try where the diagnosis says no id list works (id 0 for the embedding
    under b = id), to show what the engine then does."""
    return boundaries_to_ids(boundaries, trained_as(convention), num_layers)


def disagreements(convention: str | Convention, observations: Sequence[Observation]) -> list[str]:
    """Lists the engine served otherwise than `convention` says it would: the slots it predicts
    (`ids_to_boundaries`, sorting included) differ from the slots held. Lists the convention
    cannot express (it predicts a crash or a dropped slot) are left to the property check."""
    conv = get_convention(convention)
    out = []
    for o in observations:
        try:
            predicted = list(ids_to_boundaries(o.ids, conv, o.num_layers))
        except LayerIdError:
            continue
        if o.crash is not None:
            out.append(f"ids {list(o.ids)}: {conv.name} predicts slots {predicted}, the engine "
                       f"crashed ({o.crash})")
        elif list(o.slots or ()) != predicted:
            out.append(f"ids {list(o.ids)}: {conv.name} predicts slots {predicted}, the engine's "
                       f"held {list(o.slots or ())}")
    return out


def summary_line(entry: dict[str, Any]) -> str:
    """One layout's rule in a sentence, the form report.md and docs/CONFORMANCE.md print."""
    text = f"{entry['rule']}; slots in {entry['slot_order']}"
    if entry.get("also_consistent"):
        text += f" (also consistent: {'; '.join(entry['also_consistent'])})"
    text += {True: "; reads the ids", False: "; ignores the ids", None: ""}[entry.get("reads_ids")]
    for c in entry.get("crashes", []):
        lists = c.get("all_ids") or [c["ids"]]
        text += (f"; ids {', '.join(str(i) for i in lists[:4])}{' ...' if len(lists) > 4 else ''} "
                 f"crash: {c['error']}")
    return text


def fix_result(ids: Sequence[int], layout: str, trained: Sequence[int], suggested: bool,
               slots: Sequence[Label] | None, crash: str | None, detail: str = "") -> tuple[str, bool]:
    """(the report's wording, whether the diagnosis' claim held) for one re-served id list.

    suggested: the diagnosis named these ids as the fix, so they must capture exactly
    `trained`. Otherwise the diagnosis said no id list works and these are the literal ids
    (`literal_ids`), which must not: the wording then says what the engine does with them
    (a crash and its error, or the slots it fills), not merely that it "cannot express it"."""
    ids, trained = list(ids), list(trained)
    exact = crash is None and slots is not None and list(slots) == trained
    if suggested:
        if exact:
            return (f"fix verified: ids {ids} ({layout}) capture exactly the training boundaries "
                    f"{trained}"), True
        why = (f"ids {ids} ({layout}) crash the engine: {crash}" if crash is not None
               else f"re-served with ids {ids} ({layout}) the slots hold {list(slots or ())}, "
                    f"training used {trained}" + (f"; {detail}" if detail else ""))
        return f"fix fails: {why}", False
    if exact:
        return (f"the diagnosis says no id list fixes this, but ids {ids} ({layout}) capture "
                f"exactly {trained}: the diagnosis is wrong"), False
    if crash is not None:
        return (f"no fix: no id list makes this engine capture {trained}; the ids that would name "
                f"them, {ids} ({layout}), crash the engine: {crash}"), True
    return (f"no fix: no id list makes this engine capture {trained}; the ids that would name "
            f"them, {ids} ({layout}), fill the slots with {list(slots or ())}"), True
