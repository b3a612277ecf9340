"""What a trained draft's acceptance becomes when an engine wires it wrongly.

The golden bundle records, per draft, its held-out acceptance served as trained and under
each wrong wiring the bug zoo models (every slot one boundary early or late, the embedding
slot filled with layer 0's output, the engines' default boundaries, the slots in reverse
order, fc skipped where the widths allow it, the final boundary normed or never captured).
That table is what makes acceptance evidence: it shows, on this bundle, how much a wiring bug
costs, and the canary's threshold (`canary_threshold`) is derived from it.

Every number comes from the reference engine's own runtime (`Eagle3Runtime`), with only the
wiring decision changed, so the table measures exactly what a wrong engine would serve.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from harness.core.boundaries import get_convention
from harness.engines.speculative import Eagle3Runtime
from harness.models.draft import Eagle3Draft
from harness.models.residual import TargetStates

SERVED = "served"


@dataclass(frozen=True)
class Wiring:
    """One way of feeding the draft: which boundaries fill its slots, in slot order, and what
    the engine does to the final boundary and to fc."""

    name: str
    boundaries: tuple[int, ...]
    final: str = "pre_norm"  # boundary N as: "pre_norm" (trained), "normed", "zeros"
    skip_fc: bool = False
    what: str = ""


def wirings(trained: Sequence[int], num_layers: int, fc_in: int, hidden: int) -> list[Wiring]:
    """The served wiring first, then every wrong wiring that changes something for this draft
    (a shift that the stream's ends clamp back to training is no wrong wiring)."""
    n = num_layers
    t = tuple(int(b) for b in trained)
    out = [Wiring(SERVED, t, what="as trained")]

    def add(w: Wiring) -> None:
        if w.boundaries != t or w.final != "pre_norm" or w.skip_fc:
            out.append(w)

    add(Wiring("slots_minus_one", tuple(max(b - 1, 0) for b in t),
               what="every slot one boundary early (embedding kept)"))
    add(Wiring("slots_plus_one", tuple(min(b + 1, n) for b in t),
               what="every slot one boundary late"))
    if 0 in t:
        add(Wiring("embedding_dropped", tuple(1 if b == 0 else b for b in t),
                   what="the embedding slot filled with layer 0's output"))
    defaults = tuple(get_convention("vllm").default_boundaries(n))
    if len(defaults) == len(t):
        add(Wiring("engine_defaults", defaults, what=f"the engines' defaults {list(defaults)}"))
    if len(t) > 1:
        add(Wiring("slots_permuted", tuple(reversed(t)), what="slots in reverse order"))
    if fc_in == hidden:
        add(Wiring("fc_skipped", t, skip_fc=True, what="fc skipped (its input is as wide as the draft)"))
    if n in t:
        add(Wiring("final_normed", t, final="normed", what="boundary N taken after the final norm"))
        add(Wiring("final_missing", t, final="zeros", what="boundary N never captured (zeros)"))
    return out


class WiredRuntime(Eagle3Runtime):
    """The reference runtime with the wiring decisions of one `Wiring`."""

    def __init__(self, target: torch.nn.Module, draft: Eagle3Draft, wiring: Wiring) -> None:
        super().__init__(target, draft, wiring.boundaries)
        self.wiring = wiring

    def take_state(self, boundary: int, states: TargetStates) -> torch.Tensor:
        if boundary == self.num_layers and self.wiring.final == "normed":
            return states.final_normed
        if boundary == self.num_layers and self.wiring.final == "zeros":
            return torch.zeros_like(states.inputs[boundary])
        return states.inputs[boundary]

    def project(self, aux: torch.Tensor) -> torch.Tensor:
        return aux if self.wiring.skip_fc else self.draft.project(aux)


def per_prompt_acceptance(target: torch.nn.Module, draft: Eagle3Draft, wiring: Wiring,
                          prompts: Sequence[Sequence[int]], num_draft_tokens: int,
                          max_new_tokens: int) -> list[list[int]]:
    """Accepted draft tokens per verify round, per prompt, served with `wiring`."""
    runtime = WiredRuntime(target, draft, wiring)
    try:
        return [runtime.speculative(p, max_new_tokens, num_draft_tokens).trace for p in prompts]
    finally:
        runtime.close_runtime()


def mean_acceptance_length(traces: Sequence[Sequence[int]]) -> float:
    """1 + accepted / rounds over all prompts (vLLM's mean acceptance length)."""
    rounds = sum(len(t) for t in traces)
    return 1.0 + sum(sum(t) for t in traces) / rounds if rounds else float("nan")


@dataclass(frozen=True)
class Canary:
    """The prompts on which this draft's acceptance tells its wiring, and where the line is."""

    prompts: tuple[int, ...]  # indices into the held-out prompts
    served: float  # mean acceptance length on them, served as trained
    best_wrong: float  # the highest any wrong wiring reaches on them
    best_wrong_wiring: str
    threshold: float


def choose_canary(traces: dict[str, list[list[int]]], count: int, fraction: float) -> Canary:
    """The `count` held-out prompts where serving as trained beats the best wrong wiring by
    most (ties: the higher served acceptance, then the lower index), and the threshold
    `fraction` of the way from the best wrong wiring's acceptance on them to the served one
    (`harness.core.tolerances.CANARY_REASON` says why that fraction)."""
    served = traces[SERVED]
    wrong = {k: v for k, v in traces.items() if k != SERVED}

    def margin(i: int) -> tuple[float, float, int]:
        mine = mean_acceptance_length([served[i]])
        worst = max((mean_acceptance_length([v[i]]) for v in wrong.values()), default=1.0)
        return (mine - worst, mine, -i)

    chosen = tuple(sorted(sorted(range(len(served)), key=margin, reverse=True)[:count]))
    mine = mean_acceptance_length([served[i] for i in chosen])
    best_name, best = "", 1.0
    for name, v in wrong.items():
        acc = mean_acceptance_length([v[i] for i in chosen])
        if acc > best or not best_name:
            best_name, best = name, acc
    return Canary(chosen, mine, best, best_name, best + fraction * (mine - best))


def wiring_table_markdown(manifest: dict) -> str:
    """The manifest's wiring table as docs/BUNDLE.md shows it (`eagle3-conformance golden table`)."""
    lines = ["| draft (boundaries) | acc_k (TTT steps 0..6) | predicted | served | wiring: boundaries -> "
             "acceptance length (loss) | canary line (served / best wrong) |",
             "|---|---|---|---|---|---|"]
    for name, d in manifest["drafts"].items():
        rows = d.get("wirings")
        if not rows:
            continue
        wrong = "; ".join(f"{w} {r['boundaries']} -> {r['acceptance_length']:.2f} ({r['loss']:+.0%})"
                          for w, r in rows.items() if w != SERVED)
        c = d.get("canary", {})
        line = (f"{c['threshold']:.2f} ({c['served']:.2f} / {c['best_wrong']:.2f} "
                f"{c['best_wrong_wiring']})" if c else "-")
        lines.append(f"| {name} {d['boundaries']} | {', '.join(f'{a:.2f}' for a in d['acc_k'])} | "
                     f"{d['predicted_acceptance_length']:.2f} | {rows[SERVED]['acceptance_length']:.2f} | "
                     f"{wrong} | {line} |")
    return "\n".join(lines)
