"""An adapter that serves some draft configs and cannot be wired for others, loaded by dotted
path (`--engine partial_adapters:<Class>`) in tests/test_inexpressible_configs.py: what the
real-vLLM control (harness.engines.controls) is on a slot order vLLM's ascending sort cannot
give. It is the reference engine, refusing at start-up."""

from __future__ import annotations

from pathlib import Path

from harness.engines.base import ConfigInexpressible, EngineOptions
from harness.engines.reference import ReferenceEngine


class SortedSlotsOnly(ReferenceEngine):
    """The reference, refusing a draft whose training boundaries are not in ascending slot order
    (ConfigInexpressible: that config alone); every other config it serves as trained."""

    def __init__(self, target_dir: Path, draft_dir: Path, options: EngineOptions) -> None:
        super().__init__(target_dir, draft_dir, options)
        trained = list(self.capture_boundaries())
        if trained != sorted(trained):
            raise ConfigInexpressible(f"slot order {trained} is not ascending; this engine sorts")
