"""What `eagle3-conformance --help` and `--version` print beyond argparse's usage lines: a
worked example for every subcommand (a user copies a line that runs, rather than composing one
from the option list), and the version with the commit a certificate would name."""

from __future__ import annotations

import argparse

PROG = "eagle3-conformance"

# subcommand path -> example lines, each runnable from a checkout or an installed wheel
EXAMPLES: dict[str, tuple[str, ...]] = {
    "": (
        f"{PROG} run --report-dir reports/reference",
        f"{PROG} verify-certificate reports/reference/certificate.json",
        f"{PROG} selftest --report-dir out/selftest",
        f"{PROG} <command> --help      (examples for each command)",
    ),
    "run": (
        f"{PROG} run --report-dir reports/reference            # reference engine, committed bundle",
        f"{PROG} run --engine vllm --dtype bfloat16 --report-dir reports/vllm",
        f"{PROG} run --engine mypkg.adapter:MyEngine --device cuda --report-dir out/",
        f"{PROG} run -k capture --profile dev                  # only the capture checks",
        f"{PROG} run -- --collect-only -q                      # list the checks (no verdict)",
        f"{PROG} run --report-dir out/ -- -n 2                 # pytest-xdist: 2 workers",
    ),
    "selftest": (
        f"{PROG} selftest --report-dir out/selftest",
        f"{PROG} selftest --mutant fc_skipped_width_match --mutant ids_plus_one --report-dir out/st",
        f"{PROG} selftest --dtype bfloat16 --jobs 2 --report-dir out/st-bf16",
    ),
    "golden": (
        f"{PROG} golden verify --pinned golden/tiny-dsv3",
        f"{PROG} golden build --out /tmp/smoke --size smoke",
    ),
    "golden build": (
        f"{PROG} golden build --out /tmp/smoke --size smoke    # every stage on a sliver (~15 s)",
        f"{PROG} golden build --out /tmp/rebuilt/tiny-dsv3 --seed 14 --device cuda --threads 6",
    ),
    "golden diff": (f"{PROG} golden diff golden/tiny-dsv3 /tmp/rebuilt/tiny-dsv3",),
    "golden verify": (
        f"{PROG} golden verify golden/tiny-dsv3",
        f"{PROG} golden verify --pinned golden/tiny-dsv3   # also the committed digest",
    ),
    "golden wirings": (f"{PROG} golden wirings golden/tiny-dsv3",),
    "doctor": (
        f"{PROG} doctor --target ckpt/target --draft ckpt/eagle3 --report-dir out/",
        f"{PROG} doctor --target ckpt/target --draft ckpt/eagle3 --engine vllm --report-dir out/",
        f"{PROG} doctor --target T --draft D --convention specforge --prompts sample.json",
    ),
    "convert-check": (
        f"{PROG} convert-check golden/tiny-dsv3/draft-specforge-default converted/ --target golden/tiny-dsv3/target",
        f"{PROG} convert-check ckpt/specforge-draft draft.gguf --from-convention specforge --target ckpt/target",
        f"{PROG} convert-check ckpt/eagle3 out/ --from-convention embedding-minus-one --to-engine vllm --json cc.json",
    ),
    "conformance-table": (
        f"{PROG} conformance-table reports/*/report.json --out docs/CONFORMANCE.md",),
    "verify-certificate": (
        f"{PROG} verify-certificate reports/reference/certificate.json",
        f"{PROG} verify-certificate cert.json --report report.json --bundle golden/tiny-dsv3",
    ),
}


def epilog(path: str) -> str | None:
    lines = EXAMPLES.get(path)
    return None if not lines else "examples:\n" + "\n".join(f"  {line}" for line in lines)


def apply_examples(parser: argparse.ArgumentParser, path: str = "") -> None:
    """Give `parser` and every subparser under it its examples as the --help epilog, kept
    line by line (RawDescriptionHelpFormatter)."""
    text = epilog(path)
    if text and (not parser.epilog or "examples:" not in parser.epilog):
        # a parser's own epilog (doctor's exit codes) comes first, the examples after it
        parser.epilog = f"{parser.epilog}\n\n{text}" if parser.epilog else text
        parser.formatter_class = argparse.RawDescriptionHelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                apply_examples(sub, f"{path} {name}".strip())


def version_text() -> str:
    """`eagle3-conformance 0.1.0 (commit 0123abcd…)`: what a certificate's suite entry says."""
    from harness import __version__
    from harness.golden.paths import REPO_ROOT
    from harness.reports.certificate import suite_commit

    state = suite_commit(REPO_ROOT)
    commit = state["commit"]
    where = (f"commit {commit[:12]}{' + local changes' if state['dirty'] else ''}" if commit
             else "commit unknown")
    return f"{PROG} {__version__} ({where})"
