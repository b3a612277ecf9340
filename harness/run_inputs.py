"""The values of `run`'s options, checked before anything runs: one line naming the problem
and the fix, shared by the CLI and the pytest plugin so both refuse the same inputs.

Only what argparse cannot check lives here (argparse already checks types and choices).
"""

from __future__ import annotations

# A verify step feeds the target k + 1 tokens and the suite generates at most 32 new tokens
# per prompt (the bundle's continuation length), so a chain longer than that is never
# exercised; the bundle's drafts were trained with 7 TTT steps. 32 is a generous ceiling
# that still refuses typos such as 1000.
MAX_DRAFT_TOKENS = 32


def device_problem(device: str) -> str | None:
    """Why torch cannot place a model on `device` here, or None."""
    if device == "cpu":
        return None
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        return f"--device {device!r} is not a torch device; use cpu, cuda or cuda:N"
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            return (f"--device {device}: this torch build ({torch.__version__}) sees no CUDA "
                    f"device; use --device cpu or install a CUDA build of torch")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            return f"--device {device}: only {count} CUDA device(s) here; use cuda:0..cuda:{count - 1}"
        return None
    if dev.type != "cpu":
        return f"--device {device}: the suite runs on cpu or cuda; use one of those"
    return None


def draft_tokens_problem(k: int) -> str | None:
    if not 1 <= k <= MAX_DRAFT_TOKENS:
        return (f"--num-draft-tokens {k} is out of range; use 1..{MAX_DRAFT_TOKENS} (the suite "
                f"generates at most {MAX_DRAFT_TOKENS} tokens per prompt)")
    return None


def timeout_scale_problem(scale: float) -> str | None:
    if not scale >= 0 or scale == float("inf"):
        return (f"--engine-timeout-scale {scale} is not a factor; use a number >= 0 (0 turns the "
                f"engine-call deadlines off)")
    return None


def run_option_problem(device: str, num_draft_tokens: int, timeout_scale: float) -> str | None:
    """The first problem with these option values, or None."""
    return (draft_tokens_problem(num_draft_tokens) or timeout_scale_problem(timeout_scale)
            or device_problem(device))
