"""certificate.json: what one `run` certifies, in a form a vendor publishes and a user checks.

The report says everything a run saw; the certificate says what it claims, per concern, and
pins what the claim rests on: the suite (version, git commit), the adapter (its source file's
sha256), the bundle (its manifest digest, and whether that is the digest pinned for the
committed bundle), the run's settings and environment, and the sha256 of the report.json it
summarises. `verify_certificate` re-derives every verdict from that report, so a certificate
whose verdicts were edited, or that sits beside another run's report, does not verify.

What verification cannot show: that the run happened as recorded. A certificate is a claim
that anyone can recompute from its report and bundle, not a signature; to trust a vendor's
verdict, rerun the suite on the named bundle and adapter and compare the two certificates.

Concerns group the suite's check modules (suites/test_*.py) by what they judge about the
engine; a module that no concern names lands in "other" and is still counted, never dropped.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib.util
import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CERTIFICATE_VERSION = 1
CERTIFICATE_FILE = "certificate.json"
KIND = "eagle3-conformance-certificate"

# concern -> suite modules (suites/test_<module>.py) whose checks judge it
CONCERNS: dict[str, tuple[str, ...]] = {
    "capture": ("aux_capture", "layer_ids"),
    "fc": ("fc_projection",),
    "decode": ("decode_inputs", "losslessness"),
    "vocab": ("vocab_mapping",),
    "batching": ("batch_invariance", "request_history"),
    "acceptance": ("acceptance", "canary"),
    "throughput": ("throughput",),
    # the bundle's draft configs linted against the target: no engine runs, so it vouches
    # for the bundle, not for the engine, and is kept out of the engine's concerns
    "config": ("draft_config",),
}
# the concerns every certificate states (config and other only where such checks exist)
ENGINE_CONCERNS = ("capture", "fc", "decode", "vocab", "batching", "acceptance", "throughput")
OTHER = "other"
BUILD_INFO = "build_info.json"  # written into harness/_bundled by setup.py
CONCERN_VERDICTS = ("pass", "fail", "known_nonconformance", "not_judged")


class CertificateError(ValueError):
    """A document that is not a certificate or report this suite wrote; one line with the fix."""


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def concern_of(check_id: str) -> str:
    """The concern a check id (`test_aux_capture.py::test_x[draft]`) belongs to."""
    module = check_id.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py").removeprefix("test_")
    return next((c for c, modules in CONCERNS.items() if module in modules), OTHER)


def concern_verdicts(report: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per concern: its verdict and coverage, derived from report.json alone (so a verifier
    recomputes exactly this).

    "pass" needs a check of the concern that passed and none that failed, errored or is a
    known nonconformance; a concern whose checks all skipped is "not_judged", never a pass.
    `complete` is false where some of its checks skipped or part of a check could not run
    (the report's coverage.not_run): the pass then covers less than the concern.
    """
    checks = report.get("checks") or []
    not_run = (report.get("summary") or {}).get("coverage", {}).get("not_run") or []
    present = {concern_of(c["id"]) for c in checks}
    names = [*ENGINE_CONCERNS, *(n for n in (*CONCERNS, OTHER)
                                 if n not in ENGINE_CONCERNS and n in present)]
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        mine = [c for c in checks if concern_of(c["id"]) == name]
        count = {s: sum(c["status"] == s for c in mine)
                 for s in ("passed", "failed", "error", "xfail", "xpass", "skipped")}
        if count["failed"] or count["error"]:
            verdict = "fail"
        elif count["xfail"]:
            verdict = "known_nonconformance"
        elif count["passed"] or count["xpass"]:
            verdict = "pass"
        else:
            verdict = "not_judged"
        reasons: dict[str, list[str]] = {}
        for c in mine:
            if c["status"] == "skipped":
                reasons.setdefault(c.get("message") or "no reason given", []).append(c["id"])
        parts = [dict(e) for e in not_run if concern_of(str(e.get("check", ""))) == name]
        out[name] = {
            "verdict": verdict,
            "checks": len(mine),
            "ran": len(mine) - count["skipped"],
            "passed": count["passed"] + count["xpass"],
            "failed": count["failed"],
            "errors": count["error"],
            "known_nonconformances": count["xfail"],
            "ran_checks": [c["id"] for c in mine if c["status"] != "skipped"],
            "skipped": [{"reason": r, "checks": ids} for r, ids in reasons.items()],
            "not_run": parts,
            "complete": bool(mine) and not count["skipped"] and not parts,
        }
    return out


def git_state(root: Path) -> dict[str, Any]:
    """The commit of the checkout at `root` and whether its tracked files differ from it;
    nulls outside a git checkout, never an error."""
    def git(*args: str) -> str | None:
        try:
            proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                                  text=True, timeout=10, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return proc.stdout.strip() if proc.returncode == 0 else None

    if not (root / ".git").exists():
        return {"commit": None, "dirty": None}
    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def suite_commit(root: Path) -> dict[str, Any]:
    """The checkout's commit, or an installed wheel's (recorded by setup.py at build time)."""
    from harness.golden.paths import BUNDLED_ROOT

    state = git_state(root)
    if state["commit"] is not None:
        return state
    try:
        info = json.loads((BUNDLED_ROOT / BUILD_INFO).read_text(encoding="utf-8"))
        return {"commit": info.get("commit"), "dirty": info.get("dirty")}
    except (OSError, ValueError, AttributeError):
        return {"commit": None, "dirty": None}


def adapter_source(engine_class: str | None) -> Path | None:
    """The source file of an adapter named `module:Class`, without importing it anew."""
    if not engine_class or ":" not in engine_class:
        return None
    module = engine_class.split(":", 1)[0]
    loaded = sys.modules.get(module)
    origin = getattr(loaded, "__file__", None)
    if origin is None:
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            return None
        origin = spec.origin if spec is not None else None
    return Path(origin).resolve() if origin and Path(origin).is_file() else None


def _pinned(name: str | None, sha256: str | None) -> dict[str, Any]:
    from harness.golden.pins import PINNED_MANIFESTS

    want = PINNED_MANIFESTS.get(name) if name else None
    return {"pinned": bool(want) and want == sha256, "pinned_sha256": want}


def _summary(report: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of the report the certificate restates; a verifier compares them one to one."""
    env = report.get("environment") or {}
    options = report.get("options") or {}
    engine = report.get("engine") or {}
    bundle = report.get("bundle") or {}
    return {
        "verdict": report["summary"]["verdict"],
        "verdict_reason": report["summary"]["verdict_reason"],
        "engine": {"name": engine.get("name"), "version": engine.get("version"),
                   "class": engine.get("class")},
        "bundle": {"name": bundle.get("name"), "sha256": bundle.get("sha256"),
                   **_pinned(bundle.get("name"), bundle.get("sha256"))},
        "run": {"profile": report.get("hypothesis_profile"),
                "hypothesis_seed": report.get("hypothesis_seed"),
                "derandomized": report.get("hypothesis_derandomize"),
                "dtype": report.get("dtype"), "device": options.get("device"),
                "num_draft_tokens": options.get("num_draft_tokens"),
                "drafts": list(report.get("drafts") or []), "started": report.get("started"),
                "duration_s": report.get("duration_s")},
        "environment": {k: env.get(k) for k in ("python", "platform", "torch", "cuda", "gpu",
                                                "transformers")},
        "concerns": concern_verdicts(report),
        "scope": scope(report),
    }


def scope(report: Mapping[str, Any]) -> dict[str, Any]:
    """Whether the verdict covers the whole suite: no check deselected (-k, -m), every engine
    concern judged and complete. A conformant verdict over less is stated as partial."""
    concerns = concern_verdicts(report)
    selection = report.get("selection") or {}
    not_judged = [n for n in ENGINE_CONCERNS if concerns[n]["verdict"] == "not_judged"]
    partial = [n for n in ENGINE_CONCERNS
               if concerns[n]["verdict"] != "not_judged" and not concerns[n]["complete"]]
    deselected = int(selection.get("deselected") or 0)
    return {"complete": not (not_judged or partial or deselected), "deselected": deselected,
            "keyword": selection.get("keyword"), "markexpr": selection.get("markexpr"),
            "not_judged": not_judged, "partial": partial}


def build_certificate(report: Mapping[str, Any], report_text: str) -> dict[str, Any]:
    """The certificate of `report`, whose serialised form (the bytes of report.json) is
    `report_text`. Facts the report does not hold (suite commit, adapter digest, where the
    bundle lay) are read here, at the end of the run that produced it."""
    from harness import __version__
    from harness.golden.bundle import sha256_file
    from harness.golden.paths import REPO_ROOT

    out = _summary(report)
    adapter = adapter_source(out["engine"]["class"])
    out["engine"].update({"adapter_path": str(adapter) if adapter else None,
                          "adapter_sha256": sha256_file(adapter) if adapter else None})
    out["bundle"]["path"] = (report.get("bundle") or {}).get("path")
    return {
        "kind": KIND,
        "certificate_version": CERTIFICATE_VERSION,
        "issued": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "suite": {"name": "eagle3-conformance", "version": __version__, **suite_commit(REPO_ROOT)},
        **out,
        "report": {"file": "report.json", "sha256": sha256_bytes(report_text.encode("utf-8")),
                   "format_version": report.get("format_version")},
    }


def certificate_files(report: Mapping[str, Any], report_text: str) -> dict[str, str]:
    """certificate.json and badge.svg for the report folder (written before report.json);
    under GitHub Actions the summary also goes to the job page (harness.reports.ci_summary)."""
    from harness.reports.badge import render_badge
    from harness.reports.ci_summary import append_step_summary

    cert = build_certificate(report, report_text)
    append_step_summary(report, cert)
    return {CERTIFICATE_FILE: json.dumps(cert, indent=2) + "\n", "badge.svg": render_badge(cert)}


# -- verification ----------------------------------------------------------------------------


def load_json(path: Path, what: str) -> tuple[dict[str, Any], bytes]:
    """A JSON object from disk, or CertificateError naming the file and the fix."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise CertificateError(f"cannot read {what} {path} ({e.strerror or e}); pass the "
                               f"{what} a run wrote") from None
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise CertificateError(f"{path} is not JSON ({str(e).splitlines()[0]}); pass the "
                               f"{what} a run wrote") from None
    if not isinstance(doc, dict):
        raise CertificateError(f"{path} is not a JSON object; pass the {what} a run wrote")
    return doc, data


def _differences(claimed: Any, actual: Any, where: str) -> list[str]:
    """Where two JSON values differ, by path (dicts key by key, the rest whole)."""
    if isinstance(claimed, dict) and isinstance(actual, dict):
        out: list[str] = []
        for key in sorted(set(claimed) | set(actual)):
            out += _differences(claimed.get(key), actual.get(key), f"{where}.{key}")
        return out
    if claimed != actual:
        return [f"{where}: certificate says {json.dumps(claimed)[:120]}, "
                f"the report gives {json.dumps(actual)[:120]}"]
    return []


def verify_certificate(cert: Mapping[str, Any], report: Mapping[str, Any], report_bytes: bytes,
                       bundle_dir: Path | None = None) -> list[str]:
    """Every way `cert` disagrees with the report (and the bundle, when given); [] when it
    verifies. Raises CertificateError where the bundle is not one (bad input)."""
    problems: list[str] = []
    got = sha256_bytes(report_bytes)
    claimed = (cert.get("report") or {}).get("sha256")
    if got != claimed:
        problems.append(f"report sha256 is {got[:16]}…, the certificate summarises "
                        f"{str(claimed)[:16]}…: not the report this certificate was issued for")
    expected = _summary(report)
    for key, value in expected.items():
        mine = cert.get(key)
        if key in ("engine", "bundle") and isinstance(mine, dict):
            mine = {k: mine.get(k) for k in value}
        problems += _differences(mine, value, key)
    if bundle_dir is not None:
        problems += _bundle_problems(cert, Path(bundle_dir))
    return problems


def _bundle_problems(cert: Mapping[str, Any], bundle_dir: Path) -> list[str]:
    from harness.golden.bundle import MANIFEST, BundleError, load_bundle, sha256_file

    manifest = bundle_dir / MANIFEST
    if not manifest.is_file():
        raise CertificateError(f"{bundle_dir} holds no {MANIFEST}; pass the bundle folder the "
                               f"run used (e.g. golden/tiny-dsv3)")
    claimed = (cert.get("bundle") or {}).get("sha256")
    got = sha256_file(manifest)
    if got != claimed:
        return [f"bundle {bundle_dir}: manifest sha256 {got[:16]}…, the certificate names "
                f"{str(claimed)[:16]}…: not the bundle the run used"]
    try:
        load_bundle(bundle_dir)  # every file against the hash the manifest pins
    except BundleError as e:
        return [f"bundle {bundle_dir}: {str(e).splitlines()[0]}"]
    return []


def verify_paths(cert_path: Path, report_path: Path | None = None,
                 bundle_dir: Path | None = None) -> tuple[dict[str, Any], list[str]]:
    """(the certificate, its problems) for `verify-certificate`: the report defaults to the
    certificate's neighbour of the name it records. CertificateError for bad input: a file
    that is missing, not JSON, or not a valid certificate/report by its schema."""
    from harness.schemas import problems as schema_problems

    cert, _ = load_json(Path(cert_path), "certificate")
    invalid = schema_problems(cert, "certificate")
    if invalid:
        raise CertificateError(f"{cert_path} is not a valid certificate ({invalid[0]}"
                               f"{f'; {len(invalid) - 1} more' if len(invalid) > 1 else ''}); "
                               f"pass the certificate.json a run wrote")
    if report_path is None:
        report_path = Path(cert_path).parent / str(cert["report"]["file"])
    report, data = load_json(Path(report_path), "report")
    invalid = schema_problems(report, "report")
    if invalid:
        raise CertificateError(f"{report_path} is not a valid report ({invalid[0]}); pass the "
                               f"report.json the certificate summarises (--report)")
    if bundle_dir is not None and not Path(bundle_dir).is_dir():
        raise CertificateError(f"bundle {bundle_dir} is not a folder; pass the bundle the run "
                               f"used (e.g. golden/tiny-dsv3)")
    return cert, verify_certificate(cert, report, data, bundle_dir)


def concern_line(concerns: Mapping[str, Mapping[str, Any]]) -> str:
    """`capture pass, fc pass (partial), throughput not_judged`, in the certificate's order."""
    return ", ".join(f"{n} {c['verdict']}" + ("" if c["complete"] or c["verdict"] == "not_judged"
                                              else " (partial)")
                     for n, c in concerns.items())


def summary_line(cert: Mapping[str, Any]) -> str:
    """The verdict, its scope and the concerns in one line (verify-certificate prints it)."""
    scope_ = cert.get("scope") or {}
    verdict = str(cert["verdict"])
    if not scope_.get("complete"):
        why = [f"{scope_['deselected']} check(s) deselected"] if scope_.get("deselected") else []
        why += [f"not judged: {', '.join(scope_['not_judged'])}"] if scope_.get("not_judged") else []
        why += [f"partly judged: {', '.join(scope_['partial'])}"] if scope_.get("partial") else []
        verdict += f" (partial: {'; '.join(why)})"
    engine = cert["engine"]
    return (f"{verdict} — engine {engine['name']} ({engine.get('version') or 'version unknown'}), "
            f"bundle {cert['bundle'].get('name')}{'' if cert['bundle'].get('pinned') else ' (not the pinned one)'}"
            f", dtype {cert['run'].get('dtype')} — {concern_line(cert['concerns'])}")
