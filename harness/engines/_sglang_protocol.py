"""What the SGLang adapter and its worker process agree on: the meta_info keys read per
request, the greedy request the worker sends and the output key it reads. Its own module so
that the adapter (`sglang.py`) and the worker (`_sglang_worker.py`) both import it and
neither imports the other (they did: an import circle)."""

from __future__ import annotations

from typing import Any

# meta_info keys the adapter reads, per request (tokenizer_manager.py writes them).
META_COMPLETION_TOKENS = "completion_tokens"
META_VERIFY_CT = "spec_verify_ct"
META_HISTOGRAMS = ("spec_correct_drafts_histogram", "spec_accept_histogram")
META_KEYS = (META_COMPLETION_TOKENS, META_VERIFY_CT, *META_HISTOGRAMS)


# The request the worker sends: `Engine.generate(input_ids=..., sampling_params=...)`, greedy.
GENERATE_ARGS = ("input_ids", "sampling_params")
SAMPLING_KEYS = ("temperature", "max_new_tokens", "ignore_eos")
OUTPUT_IDS = "output_ids"  # the generated ids of an output when the tokenizer is skipped


def sampling_params(max_new_tokens: int) -> dict[str, Any]:
    """Greedy, exactly `max_new_tokens` (ignore_eos: the reference stops on length only)."""
    return dict(zip(SAMPLING_KEYS, (0.0, max_new_tokens, True), strict=True))
