"""One suite run's state, kept in the pytest config's stash: the options as given, the bundle
(loaded and verified once), the engine class (resolved once), the xfails file in use, what
each engine said about itself, and the collector the report is built from.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.reports.report import ReportCollector
from harness.run.options import OptionError, bundle_path, load_run_bundle
from harness.run.registry import EngineLookupError, resolve_engine


@dataclass
class State:
    config: pytest.Config
    engine_name: str
    report_dir: Path | None
    started: float = field(default_factory=time.time)
    collector: ReportCollector = field(default_factory=ReportCollector)
    junit_tmp: Path | None = None
    conformance_run: bool = False
    engine_cls: type | None = None
    engine_problem: str | None = None
    resolved: bool = False
    unmatched_xfails: list[str] = field(default_factory=list)
    engine_info: dict[str, Any] = field(default_factory=dict)  # per draft, from Engine.info()
    xfails_path: Path | None = None
    usage_error: str | None = None  # bad input met during collection; stops the run after it
    report: dict[str, Any] | None = None
    hung: str | None = None  # set when an engine call timed out: later engines are not started
    deselected: int = 0  # checks -k / -m / --deselect left out: a certificate of a subset says so
    from_workers: bool = False  # an xdist controller: the checks ran in workers (distributed.py)
    _bundle: Any = None

    def option(self, name: str) -> Any:
        return self.config.getoption(name)

    def bundle_path(self) -> Path:
        return bundle_path(self.option("bundle"))

    def bundle(self) -> Any:
        """Loaded (and hash-verified) once, with the --draft ones in it; bad input stops the
        run with one line."""
        if self._bundle is None:
            try:
                self._bundle = load_run_bundle(self.bundle_path(), self.option("draft") or ())
            except OptionError as e:
                self.usage_error = str(e)
                raise pytest.UsageError(self.usage_error) from None
        return self._bundle

    def drafts(self) -> list[str]:
        return list(dict.fromkeys(self.option("draft") or self.bundle().draft_names))

    def resolve(self) -> None:
        if self.resolved:
            return
        self.resolved = True
        from harness.engines.base import EngineUnavailable

        try:
            self.engine_cls = resolve_engine(self.engine_name)
        except EngineLookupError as e:
            self.usage_error = str(e)
            raise pytest.UsageError(self.usage_error) from None
        except EngineUnavailable as e:
            self.engine_problem = f"engine {self.engine_name} unavailable: {e}"
            self.collector.engine_unavailable = self.engine_problem

    def dtype(self) -> str | None:
        return self.option("dtype") or getattr(self.engine_cls, "default_dtype", None)

    def bundle_json(self) -> dict[str, Any]:
        """The report's bundle entry, also when the bundle never loaded (bad input)."""
        if self._bundle is not None:
            from harness.run.bundle_gate import is_pinned

            b = self._bundle
            return {"path": str(Path(b.path).resolve()), "name": b.name, "sha256": b.manifest_sha256(),
                    "pinned": is_pinned(b)}
        path = self.bundle_path()
        manifest = path / "manifest.json"
        try:
            where = str(path.resolve())
        except (RuntimeError, OSError):  # a symlink loop (RuntimeError before Python 3.13)
            where = str(path.absolute())
        out: dict[str, Any] = {"path": where, "name": None, "sha256": None}
        if manifest.is_file():
            data = manifest.read_bytes()
            out["sha256"] = hashlib.sha256(data).hexdigest()
            try:
                out["name"] = json.loads(data).get("name")
            except (ValueError, AttributeError):
                pass
        return out
