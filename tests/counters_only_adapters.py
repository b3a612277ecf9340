"""Engines seen the way a server is: generation and its acceptance counters, nothing else (no
capture hook, no fc probe, no per-round traces, no per-prompt split), loaded by dotted path
(`--engine counters_only_adapters:<Class>`) in tests/test_acceptance_truth.py. What the suite
can say about such an engine's wiring comes from the acceptance checks and the canary alone.

`Reference` is the reference engine so reduced (the control); `SlotsOneEarly` is the zoo's
`ids_minus_one` so reduced: every slot one boundary early, what vLLM 0.32 does to a SpecForge
draft (vllm-project/vllm#43671)."""

from __future__ import annotations

from collections.abc import Sequence

from harness.engines.base import Capability, Generation
from harness.engines.reference import ReferenceEngine
from harness.engines.zoo import IdsMinusOne


class CountersOnly(ReferenceEngine):
    """Generation only, reporting tokens and the summed acceptance counters."""

    capabilities = frozenset({Capability.GENERATE})

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 speculative: bool) -> Generation:
        gen = super().generate(prompts, max_new_tokens, speculative)
        return Generation(tokens=gen.tokens, acceptance=gen.acceptance)


class Reference(CountersOnly):
    name = "reference (counters only)"


class SlotsOneEarly(CountersOnly, IdsMinusOne):
    name = "zoo:ids_minus_one (counters only)"
