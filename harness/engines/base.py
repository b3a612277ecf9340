"""The adapter protocol a vendor implements to get the whole suite (cf. ONNX backend tests).

An adapter is handed a target folder and a draft folder (HF layout, SpecForge draft
layout) and must serve them exactly as its engine would for a user: no conversion, no
rewriting of layer ids. It reports what the engine hands the draft, so the suite can
compare that against training.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from harness.core.boundaries import Convention
from harness.core.throughput import StepCosts


class Capability(str, enum.Enum):
    CAPTURE = "capture"  # features handed to the draft (concatenated aux states)
    FC_PROBE = "fc_probe"  # the draft's fc output on those features
    GENERATE = "generate"  # greedy generation with and without speculation + acceptance
    THROUGHPUT = "throughput"  # generate timed by suites/test_throughput.py (pytest-benchmark)
    DECODE_INPUTS = "decode_inputs"  # what the draft is fed at prefill and after each verify


class EngineUnavailable(RuntimeError):
    """The engine cannot run on this machine (missing package, CPU feature, GPU); tests skip
    with this message as the reason."""


class ConfigInexpressible(EngineUnavailable):
    """The engine cannot be wired for this one draft config, though it serves others (the
    real-vLLM control, harness.engines.controls, on a slot order vLLM's ascending sort cannot
    give). A property that draws configs (suites/test_layer_ids.py) draws another instead of
    skipping the whole check, and counts it in the report; anywhere else it skips like
    EngineUnavailable."""


class EngineCrash(RuntimeError):
    """The engine failed on this draft (load, prefill, drafting): a conformance failure, not an
    unavailable engine. Plain data, its message only: put the engine's own error text in it,
    whole (its first line is quoted in the report). The suite, which holds the draft's spec,
    diagnoses it: a matmul shape error there says how many aux slots reached fc."""


@dataclass(frozen=True)
class EngineOptions:
    dtype: str = "float32"  # "float32" | "bfloat16" | "float16"
    device: str = "cpu"
    num_draft_tokens: int = 4  # chain length k
    tree_topk: int = 1  # >1: tree drafting with that branching at each depth (if supported)
    max_model_len: int = 256
    seed: int = 0
    # How the draft's layer ids were meant (a key of harness.core.boundaries.CONVENTIONS). Only an
    # engine that honours training (the reference) reads it; a real engine has its own rule.
    training_convention: str | None = None
    # The target over the processes of a torchrun launch (a name of
    # harness.models.placement.PLACEMENTS), for a target one device cannot hold. Only the
    # reference reads it; a real engine is placed by its own launcher.
    placement: str | None = None


@dataclass
class Acceptance:
    """Spec-decode counters in vLLM's vocabulary (SGLang's are converted into it)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per verify step including the bonus token, as vLLM and SGLang report it."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else float("nan")

    @property
    def per_position_rate(self) -> list[float]:
        return [a / self.num_drafts if self.num_drafts else float("nan")
                for a in self.accepted_per_pos]

    def __add__(self, other: Acceptance) -> Acceptance:
        width = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        pad = lambda xs: list(xs) + [0] * (width - len(xs))  # noqa: E731
        return Acceptance(
            self.num_drafts + other.num_drafts,
            self.num_draft_tokens + other.num_draft_tokens,
            self.num_accepted_tokens + other.num_accepted_tokens,
            [a + b for a, b in zip(pad(self.accepted_per_pos), pad(other.accepted_per_pos), strict=True)],
        )


@dataclass
class Generation:
    tokens: list[list[int]]  # new tokens per prompt, prompt excluded
    acceptance: Acceptance | None = None  # None for non-speculative runs
    per_prompt_acceptance: list[Acceptance] | None = None  # where the engine reports it
    # Where the engine exposes them: accepted draft tokens per verify round, per prompt, and
    # every draft token proposed (target ids), per prompt. Checks that need them skip otherwise.
    traces: list[list[int]] | None = None
    proposed: list[list[int]] | None = None


@dataclass
class Capture:
    """What the engine handed the draft for each prompt token during prefill.

    features[i]: [prompt_len_i, num_aux * target_hidden] float32, in the engine's slot
    order. fc_out[i]: [prompt_len_i, draft_hidden] where the engine exposes it.
    """

    features: list[torch.Tensor]
    fc_out: list[torch.Tensor] | None = None


@dataclass
class DraftFeed:
    """One feed of target features to the draft: the prefill, or the re-feed of the verified
    positions after a verify round. Rows the engine feeds only as padding (vLLM's padded
    drafter batch feeds the rejected drafts too and masks them out) are left out.

    positions: the draft positions the rows were fed at (what its rotary embedding used);
    features: [len(positions), num_aux * target_hidden] float32, the fc input of those rows;
    step_positions: the positions of the draft steps run after this feed to draft the next
    round (steps 2..k, each fed the draft's own state; empty where not exposed)."""

    positions: list[int]
    features: torch.Tensor
    step_positions: list[int] = field(default_factory=list)


@dataclass
class DecodeInputs:
    """Per prompt, the greedy speculative continuation and every feed of target features the
    draft got on the way, in order (the prefill first)."""

    tokens: list[list[int]]  # new tokens per prompt, prompt excluded
    feeds: list[list[DraftFeed]]


# Engine.draft_budget's values (what each means: beside the attribute)
DRAFT_BUDGETS = ("full", "capped")


class Engine(abc.ABC):
    """One engine. Subclasses declare `name` and `capabilities` and implement what they can."""

    name: ClassVar[str]
    capabilities: ClassVar[frozenset[Capability]] = frozenset()
    # The engine's own layer-id rule: a key of harness.core.boundaries.CONVENTIONS, a Convention of
    # the adapter's own (an engine the package does not know), or None when it honours the
    # draft's training convention. Diagnoses word the fixing id list in it.
    convention: ClassVar[str | Convention | None] = None
    # Where the target runs as a pipeline: the first decoder layer of each stage, ascending
    # (SGLang and transformers split N layers evenly: (0, N//2) for two stages), set by an
    # adapter that knows its launch. None: no pipeline, or not said. Only diagnoses read it: a
    # capture of the last stage's boundaries alone is then named `capture_missing_rank`.
    pipeline_stages: tuple[int, ...] | None = None
    default_dtype: ClassVar[str] = "float32"
    # True when the constructor does all the start-up (loads every model) and the first call
    # does none: its first call's deadline is then derived from the measured construction
    # time (harness.run.timeouts), not the fixed allowance a lazily-starting engine (vLLM's
    # workers start on the first call) needs. False, the safe default for an adapter that
    # does not say: a correct engine must never be called hung for starting up.
    starts_in_constructor: ClassVar[bool] = False
    # How the engine drafts near the end of a request, which its counters then count:
    # "full" (vLLM, SGLang, the reference): every round drafts k, a round that runs past
    # max_new_tokens is counted whole and the output cut; "capped" (llama.cpp's server,
    # get_n_draft_max): a round drafts at most remaining - 1 tokens, none when one is left.
    # Both are correct; the golden trace is replayed under the engine's rule before its mean
    # acceptance is compared (harness.judgement.acceptance.acceptance_from_traces), since on
    # 36-token requests capping alone lowers the mean by ~2.5% (measured on llama.cpp).
    draft_budget: ClassVar[str] = "full"  # one of DRAFT_BUDGETS

    def __init__(self, target_dir: Path, draft_dir: Path, options: EngineOptions) -> None:
        self.target_dir = Path(target_dir)
        self.draft_dir = Path(draft_dir)
        self.options = options
        # first, so that a target whose rule the adapter does not model is refused before any
        # start-up work (a scratch folder, a worker)
        self.convention = type(self).convention_for_target(self.target_dir)

    @classmethod
    def convention_for_target(cls, target_dir: Path) -> str | Convention | None:
        """The layer-id rule this engine applies to that target, known before it starts (the
        suite's layer-id checks and the doctor word ids in it): `convention`, unless the rule
        depends on the target's architecture, as vLLM's does (deepseek_v2's capture differs from
        the other models'); such an engine overrides this, and `__init__` sets the instance's
        `convention` from it. Raises EngineUnavailable for a target whose rule the adapter does not model."""
        return cls.convention

    @abc.abstractmethod
    def version(self) -> str:
        """The engine's own version string (package version, commit)."""

    def startup_measured_s(self) -> float | None:
        """Seconds of a start-up this engine measured while it was constructed, which its
        first call may spend again, for an engine that starts lazily: vLLM's and SGLang's
        adapters start the target alone in the constructor and the engine with the draft on
        the first call, a start-up of the same kind. The first call's deadline is then
        derived from it (harness.run.timeouts) instead of the fixed allowance. None: nothing
        measured (the fixed allowance stays)."""
        return None

    def capture(self, prompts: Sequence[Sequence[int]]) -> Capture:
        raise NotImplementedError(f"{self.name} cannot capture draft features")

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 speculative: bool) -> Generation:
        raise NotImplementedError(f"{self.name} cannot generate")

    def decode_inputs(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> DecodeInputs:
        """Greedy speculative generation of each prompt, reporting what the draft was fed at
        prefill and after every verify round (`DecodeInputs`). Record it where the engine
        hands the rows to the draft, never recompute it in the adapter."""
        raise NotImplementedError(f"{self.name} cannot report the draft's decode-time inputs")

    def step_costs(self, prompt: Sequence[int], acceptance_length: float) -> StepCosts | None:
        """Seconds per plain step, verify of k + 1 tokens, draft step and draft feed on this
        engine's kernels at prefix `prompt` (see harness.core.throughput), or None where the
        engine does not expose its steps; the cost-model gate then skips with that reason."""
        return None

    def info(self) -> dict[str, Any]:
        """What the engine decided or worked around for this draft (runner, ids it set,
        platform switches), recorded in report.json under engine.info.<draft>. Called once,
        before close(); must not start work the checks did not."""
        return {}

    def close(self) -> None:  # noqa: B027 - most engines need no explicit teardown
        """Free the engine; later calls may fail. Called once per engine, after its checks."""


def target_architecture(target_dir: Path) -> str:
    """The first of the target config's `architectures` (transformers' class name), which
    picks an engine's capture rule where it depends on the model."""
    import json

    try:
        config = json.loads((Path(target_dir) / "config.json").read_text())
        return str((config.get("architectures") or [""])[0])
    except (OSError, ValueError, AttributeError) as e:
        raise EngineUnavailable(f"cannot read the target's architecture from "
                                f"{target_dir}/config.json: {e}") from None
