"""The suite under pytest-xdist (`pytest -n N`): one verdict and one report from many workers.

Each worker runs its share of the checks with its own engines and records them in its own
`ReportCollector`; the controller runs no check. So a worker hands its record over at the end
(xdist sends `config.workeroutput` to the controller when a worker finishes), the controller
merges the records as they arrive, and only the controller writes report.json, report.md,
report.html and junit.xml (pytest's junitxml already runs on the controller alone). A check
id lives on exactly one worker, so merging never has to choose between two outcomes.

Where there are several GPUs, worker gwN serves its engines on cuda:(N mod GPUs) when the run
asks for plain `--device cuda`, so that one worker per GPU follows from `-n <number of GPUs>`.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from harness.reports.report import CheckResult, ReportCollector

PAYLOAD_KEY = "eagle3_conformance"


def is_worker(config: Any) -> bool:
    return hasattr(config, "workerinput")


def worker_index(config: Any) -> int | None:
    """N of worker gwN, or None outside xdist's workers."""
    if not is_worker(config):
        return None
    worker_id = str(config.workerinput.get("workerid", "gw0"))
    digits = worker_id.removeprefix("gw")
    return int(digits) if digits.isdigit() else 0


def worker_device(device: str, index: int | None, device_count: int) -> str:
    """The device a worker's engines use: an explicit `cuda:K` is kept; plain `cuda` becomes
    cuda:(index mod device_count) on worker `index`; anything else is unchanged."""
    if device != "cuda" or index is None or device_count < 1:
        return device
    return f"cuda:{index % device_count}"


def collector_payload(collector: ReportCollector, *, conformance_run: bool,
                      engine_info: dict[str, Any], unmatched_xfails: list[str],
                      deselected: int = 0) -> dict[str, Any]:
    """What a worker hands the controller: plain data xdist can send (execnet serialises
    dicts, lists, strings and numbers)."""
    return {"checks": [asdict(c) for c in collector.checks.values()],
            "metrics": collector.metrics,
            "engine_version": collector.engine_version,
            "engine_unavailable": collector.engine_unavailable,
            "engine_constructions": collector.engine_constructions,
            "conformance_run": conformance_run,
            "engine_info": engine_info,
            "unmatched_xfails": unmatched_xfails,
            "deselected": deselected}


def merge_payload(collector: ReportCollector, payload: dict[str, Any]) -> None:
    """Fold one worker's record into the controller's collector."""
    for raw in payload["checks"]:
        result = CheckResult(**raw)
        if result.id in collector.checks and not result.ran:
            continue  # collected on this worker, run on another: keep the run
        collector.checks[result.id] = result
        collector._by_nodeid[result.nodeid] = result.id
    for draft, metrics in payload["metrics"].items():
        collector.metrics.setdefault(draft, {}).update(metrics)
    collector.engine_version = collector.engine_version or payload["engine_version"]
    collector.engine_unavailable = collector.engine_unavailable or payload["engine_unavailable"]
    for draft, count in payload["engine_constructions"].items():
        collector.engine_constructions[draft] = collector.engine_constructions.get(draft, 0) + count
