"""The precision envelope of one prompt: the training computation run by several correct
implementations in one reduced dtype (harness/models/variants.py), and the tokens whose MoE
routing those implementations do not agree on.

Why an envelope and not a floor: the reduced-precision checks measure how far an engine's
states are from the fp32 training states, and allow what a correct engine's rounding moves
them by. Measured against ONE same-dtype computation (the reference engine's), the allowance
is the reference's own error: the reference passes by construction and a correct engine with
other kernels (vLLM on the CPU in bf16: slot medians 2.2x the reference's) fails. The envelope
is, per token and boundary, the largest error any correct implementation makes, so a correct
engine is judged against the spread of correct engines (harness.core.tolerances.REASONS).

Routing near-ties: a DeepSeek router picks the top-k experts by score. Where two scores are
closer than rounding can move them, correct implementations pick different experts and the
token's state after that layer differs by as much as a wiring bug moves it (relative error 1-2.6
measured on the H200 against the CPU). Such a token cannot tell a wiring bug from precision:
`ties` marks it from the first MoE layer whose choice is in doubt onward, and the judgement
counts it ambiguous, never failed and never passed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from harness.core.tolerances import tolerance_for
from harness.golden.features import TargetFeatures, relative_errors, target_features
from harness.models.target import decoder_layers, moe_routers, router_rule
from harness.models.variants import (
    DEVICE_MEMBERS,
    IMPLEMENTATIONS,
    Implementation,
    Routing,
    available,
    load_implementation,
    record_routing,
)


@dataclass
class Envelope:
    """One prompt, one dtype: each correct implementation's features (name -> features) and,
    per boundary and token, whether its routing is a near-tie ([N+1, T] bool). `margin` and
    `spread` ([N+1, T]) are the evidence for a tie: the fp32 router margin before each
    boundary and the most that the members' selection scores moved there (the noise a tie is
    judged against), both inf where no MoE layer precedes the boundary."""

    members: dict[str, TargetFeatures]
    ties: torch.Tensor
    margin: torch.Tensor = field(repr=False)
    spread: torch.Tensor = field(repr=False)

    @property
    def names(self) -> list[str]:
        return list(self.members)

    @property
    def num_layers(self) -> int:
        return self.ties.shape[0] - 1

    def states(self, b: int) -> torch.Tensor:
        """[M, T, H]: every member's state at boundary b."""
        return torch.stack([f.boundaries[b] for f in self.members.values()])

    def error(self, b: int, golden: TargetFeatures) -> torch.Tensor:
        """[T]: the largest relative error to the fp32 boundary b among the members."""
        return torch.stack([relative_errors(f.boundaries[b], golden.boundaries[b])
                            for f in self.members.values()]).amax(0)

    def without(self, name: str) -> Envelope:
        """The envelope the members other than `name` make (leave-one-out: an implementation
        judged against an envelope it is not part of). Ties stay as all members found them:
        they are a property of the prompt, not of the member left out."""
        if name not in self.members or len(self.members) == 1:
            raise KeyError(f"cannot leave {name!r} out of an envelope of {self.names}")
        return Envelope({k: v for k, v in self.members.items() if k != name},
                        self.ties, self.margin, self.spread)

    def prefix(self, n: int) -> Envelope:
        """The first n tokens (the prompt part of a longer feed)."""
        return Envelope({k: f.prefix(n) for k, f in self.members.items()},
                        self.ties[:, :n], self.margin[:, :n], self.spread[:, :n])


def routing_ties(fp32: Routing, members: Mapping[str, Routing], gates: Mapping[int, torch.nn.Module],
                 num_layers: int, tokens: int, *,
                 noise_factor: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ties, margin, spread), each [N+1, T]. At MoE layer k a token is tied when some member
    chose other experts than fp32 training did, or when the fp32 routing margin (the gap that
    decides the choice, the router rule's margin in harness.models.target) is within `noise_factor` times
    twice the largest move of any selection score among the members (two scores decide a gap,
    each may move that far; an engine's rounding is of the members' size but its own:
    REASONS['noise_factor']). A tie at layer k marks boundaries k+1..N."""
    ties = torch.zeros(num_layers + 1, tokens, dtype=torch.bool)
    margin = torch.full((num_layers + 1, tokens), float("inf"))
    spread = torch.full((num_layers + 1, tokens), float("inf"))
    running_tie = torch.zeros(tokens, dtype=torch.bool)
    running_margin = torch.full((tokens,), float("inf"))
    running_spread = torch.full((tokens,), float("inf"))
    for k in range(num_layers):
        if k in fp32.scores:
            ref = fp32.scores[k]
            gap = router_rule(gates[k]).margin(ref, gates[k])
            moved = torch.zeros(tokens)
            flipped = torch.zeros(tokens, dtype=torch.bool)
            want = fp32.chosen[k].sort(-1).values
            for r in members.values():
                moved = torch.maximum(moved, (r.scores[k] - ref).abs().amax(-1))
                flipped |= (r.chosen[k].sort(-1).values != want).any(-1)
            tie = flipped | (gap <= noise_factor * 2 * moved)
            running_tie = running_tie | tie
            worse = gap < running_margin
            running_margin = torch.where(worse, gap, running_margin)
            running_spread = torch.where(worse, moved, running_spread)
        ties[k + 1] = running_tie
        margin[k + 1] = running_margin
        spread[k + 1] = running_spread
    return ties, margin, spread


def envelope_members(cuda: bool | None = None) -> list[Implementation]:
    """The implementations an envelope is made of: every variant on the CPU, and the defaults
    and both composites on the GPU where torch sees one (`cuda` None: ask torch)."""
    out = list(IMPLEMENTATIONS)
    if torch.cuda.is_available() if cuda is None else cuda:
        out += [i.on("cuda") for i in IMPLEMENTATIONS if i.name in DEVICE_MEMBERS]
    return [i for i in out if available(i)]


class EnvelopeBuilder:
    """Envelopes of prompts for one target checkpoint: loads each member once (lazily, per
    dtype) and caches each prompt's envelope, so checks that ask again pay nothing. `fp32` is
    the training computation of the same checkpoint (its routing decides what a tie is)."""

    def __init__(self, target_dir: str | Path, fp32: torch.nn.Module,
                 members: Sequence[Implementation] | None = None) -> None:
        self.target_dir = Path(target_dir)
        self.fp32 = fp32
        self.members = list(members) if members is not None else envelope_members()
        self._models: dict[tuple[str, str], torch.nn.Module] = {}
        self._routed: dict[tuple, tuple[TargetFeatures, Routing]] = {}
        self._envelopes: dict[tuple, Envelope] = {}

    def _model(self, impl: Implementation, dtype: str) -> torch.nn.Module:
        key = (impl.name, dtype)
        if key not in self._models:
            self._models[key] = load_implementation(self.target_dir, getattr(torch, dtype), impl)
        return self._models[key]

    def _run(self, model: torch.nn.Module, key: tuple) -> tuple[TargetFeatures, Routing]:
        if key not in self._routed:
            with record_routing(model) as routing:
                features = target_features(model, key[-1])
            self._routed[key] = (features, routing)
        return self._routed[key]

    def member_features(self, name: str, prompt: Sequence[int], dtype: str) -> TargetFeatures:
        """One member's computation of `prompt` (cached with the envelope's)."""
        impl = next(i for i in self.members if i.name == name)
        tokens = tuple(int(t) for t in prompt)
        return self._run(self._model(impl, dtype), (impl.name, dtype, tokens))[0]

    def envelope(self, prompt: Sequence[int], dtype: str) -> Envelope:
        tokens = tuple(int(t) for t in prompt)
        key = (dtype, tokens)
        if key not in self._envelopes:
            members: dict[str, TargetFeatures] = {}
            routes: dict[str, Routing] = {}
            for impl in self.members:
                members[impl.name], routes[impl.name] = self._run(
                    self._model(impl, dtype), (impl.name, dtype, tokens))
            _, fp32 = self._run(self.fp32, ("fp32", tokens))
            layers = decoder_layers(self.fp32)
            gates = moe_routers(self.fp32)
            ties, margin, spread = routing_ties(fp32, routes, gates, len(layers), len(tokens),
                                                noise_factor=tolerance_for(dtype).noise_factor)
            self._envelopes[key] = Envelope(members, ties, margin, spread)
        return self._envelopes[key]
