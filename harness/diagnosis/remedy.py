"""Which remedies are a change of the draft's config, the change to re-serve for a diagnosis,
and how its outcome is worded: "verified" (the remedied draft, re-served through the engine
under test, was then served as trained) or "unverified: <why>" (issue #31, item 2).

A diagnosis names a cause and a remedy; a remedy that is a config change (layer ids, the key
they sit under, their order with fc's input columns to match) can be tried: the suite writes
a remedied copy of the draft, serves it through the same engine, and judges it as any draft.
A remedy that is an engine change cannot be applied from here: it stays "unverified", with
that reason, however certain the cause. The runner lives above (suites/test_layer_ids.py, which
owns the engine starts and their deadlines); this module decides nothing and starts nothing,
and imports no torch at module level (harness.reports words every diagnosis' remedy with it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.core.boundaries import Convention, LayerIdError, boundaries_to_ids, get_convention
from harness.diagnosis.record import ENGINE_VENDOR, Diagnosis

VERIFIED, UNVERIFIED = "verified", "unverified"

# kind -> the draft config change its remedy is. Every other kind's remedy is an engine change
# (docs/DIAGNOSES.md, "Which remedies the suite verifies").
CONFIG_REMEDIES: dict[str, str] = {
    "offset": "eagle_aux_hidden_state_layer_ids set to the ids that name training's boundaries "
              "under the rule the engine applies",
    "embedding_missing": "the ids that name boundary 0 where the engine can capture it",
    "final_boundary_missing": "the ids that reach boundary N where a shifted id does",
    "order_permuted": "the ids listed in the order the engine fills its slots, fc's input column "
                      "blocks (and per-slot norms) permuted to match",
    "ids_ignored": "the ids under the config key the engine reads (the other config layout)",
}


@dataclass(frozen=True)
class ConfigChange:
    """One remedied copy of a draft: its ids (in `layout`), the training convention the engine is
    told (engines that honour one), and `slot_order` where fc's input blocks are permuted (slot j
    of the copy is the original draft's slot slot_order[j]). `expected`: the boundary each of the
    copy's slots must hold for it to be served as trained."""

    ids: tuple[int, ...]
    layout: str
    expected: tuple[int, ...]
    told: str | None = None
    slot_order: tuple[int, ...] | None = None

    def describe(self) -> str:
        text = f"ids {list(self.ids)} ({self.layout})"
        if self.slot_order is not None:
            text += f" and fc's input blocks in slot order {list(self.slot_order)}"
        return text

    def to_json(self) -> dict[str, Any]:
        return {"ids": list(self.ids), "layout": self.layout, "expected": list(self.expected),
                "told": self.told, "slot_order": None if self.slot_order is None else list(self.slot_order)}


def engine_change_reason(diag: Diagnosis) -> str | None:
    """Why the suite cannot verify `diag`'s remedy by re-serving a draft: it is an engine change
    (None: it is a config change)."""
    if diag.kind == "ok":
        return None
    if diag.kind not in CONFIG_REMEDIES:
        return (f"the remedy is an engine change ({diag.kind}, for the engine vendor): no change "
                "of the draft's config fixes it, so re-serving cannot verify it")
    if diag.details.get("addressee") == ENGINE_VENDOR:
        return ("the remedy is an engine change (for the engine vendor): no id list in the "
                "engine's convention makes it capture training's boundaries (the diagnosis says "
                "why)")
    return None


def plan(diag: Diagnosis, *, config_ids: Sequence[int], layout: str, trained: Sequence[int],
         num_layers: int, told: str | None,
         engine_convention: str | Convention | None) -> list[ConfigChange] | str:
    """The remedied copies to re-serve for `diag` (any one served as trained verifies the remedy),
    or why there is none. `config_ids`, `layout`, `trained`: the draft as served and the
    boundaries its training put in each slot; `told`: the training convention the engine was
    told (None where it applies its own rule)."""
    reason = engine_change_reason(diag)
    if reason is not None:
        return reason
    train = [int(b) for b in trained]
    found = list(diag.engine_boundaries)
    ids = [int(i) for i in config_ids]
    if diag.kind == "order_permuted":
        if sorted(found, key=str) != sorted(train, key=str) or len(set(train)) != len(train):
            return "the slots are not a permutation of training's boundaries, so no order fixes them"
        order = tuple(train.index(int(b)) for b in found)  # type: ignore[arg-type]
        return [ConfigChange(ids=tuple(ids[p] for p in order), layout=layout,
                             expected=tuple(train[p] for p in order), told=told, slot_order=order)]
    if diag.suggested_layer_ids:
        # imported here: the report reads this module's wording at every run's end without torch
        from harness.golden.draft_factory import FORMATS

        layouts = FORMATS if diag.kind == "ids_ignored" else (layout,)
        return [ConfigChange(ids=tuple(diag.suggested_layer_ids), layout=lay, expected=tuple(train),
                             told=told) for lay in layouts]
    if diag.kind == "offset" and diag.offset is not None and engine_convention is None and told:
        # no declared rule to word the ids in: the measured one (every slot `offset` away, kept
        # endpoints kept) read back in the convention the engine was told
        wanted = [t if f == t else t - diag.offset for f, t in zip(found, train, strict=False)]
        try:
            shifted = boundaries_to_ids(wanted, get_convention(told), num_layers)
        except LayerIdError as err:
            return (f"no id list in the {told} convention names boundaries {wanted}, which the "
                    f"engine's shift of {diag.offset:+d} would turn into training's {train}: {err}")
        return [ConfigChange(ids=tuple(shifted), layout=layout, expected=tuple(train), told=told)]
    if engine_convention is None:
        return ("the engine declares no layer-id convention and the capture is no uniform shift, "
                "so no id list that fixes it can be derived")
    return "the diagnosis names no id list that fixes it, so there is no config change to re-serve"


def verified_text(change: ConfigChange) -> str:
    if change.slot_order is None:
        return (f"verified: re-served with {change.describe()}, the engine captured exactly the "
                f"training boundaries {list(change.expected)}")
    return (f"verified: re-served with {change.describe()}, the engine captured exactly training's "
            f"boundaries in the copy's slot order {list(change.expected)}, and fc's output (where "
            "the engine exposes it) is the trained fc's")


def failed_text(change: ConfigChange, slots: Sequence[Any] | None, crash: str | None,
                detail: str = "") -> str:
    if crash is not None:
        return f"unverified: re-served with {change.describe()}, the engine crashed: {crash}"
    return (f"unverified: re-served with {change.describe()}, the slots still hold "
            f"{list(slots or ())}, the remedy needs {list(change.expected)}"
            + (f"; {detail}" if detail else ""))


def entry(diag: Diagnosis, status: str, result: str, change: ConfigChange | None = None,
          **more: Any) -> dict[str, Any]:
    """report.json's `observed_convention.fixes` entry of one draft's remedy."""
    out: dict[str, Any] = {"remedy": status, "result": result, "diagnosis_kind": diag.kind,
                           "addressee": diag.details.get("addressee")}
    if change is not None:
        out.update(change.to_json())
    out.update(more)
    return out


NOT_RESERVED = ("unverified: a config change, not re-served in this run (test_layer_ids.py::"
                "test_suggested_fix_verified did not run for this draft, or the engine could not "
                "be re-served)")


def remedy_of(diagnosis: dict[str, Any], fix: dict[str, Any] | None) -> dict[str, str] | None:
    """What report.json says of one diagnosis' remedy ({"status", "result"}): the draft's re-served
    remedy where it addressed this kind, else why it is unverified. None for kind `ok`."""
    kind = diagnosis.get("kind")
    if kind in (None, "ok"):
        return None
    if fix is not None and fix.get("diagnosis_kind") == kind and fix.get("remedy") in (VERIFIED, UNVERIFIED):
        return {"status": str(fix["remedy"]), "result": str(fix["result"])}
    if kind not in CONFIG_REMEDIES or diagnosis.get("addressee") == ENGINE_VENDOR:
        why = (f"the remedy is an engine change ({kind}, for the engine vendor): re-serving the "
               "draft cannot verify it")
        return {"status": UNVERIFIED, "result": f"{UNVERIFIED}: {why}"}
    return {"status": UNVERIFIED, "result": NOT_RESERVED}
