"""``report.json`` (everything, for machines and for ``bench_nvml_cost.py --costs``) and ``report.md`` (the
same for a person: the machine, one line per item, then each item's checks against their bars)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

STATUS_WORD = {"pass": "PASS", "fail": "FAIL", "error": "ERROR", "recorded": "recorded", "skipped": "skipped"}


def write(directory: Path, document: dict[str, Any]) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    json_path, md_path = directory / "report.json", directory / "report.md"
    json_path.write_text(json.dumps(document, indent=1, default=str) + "\n")
    md_path.write_text(markdown(document))
    return md_path, json_path


def _cell(value: Any, limit: int = 90) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _verdict(passed: bool | None) -> str:
    return "recorded" if passed is None else "pass" if passed else "**FAIL**"


def markdown(document: dict[str, Any]) -> str:
    facts = document["machine"]
    lines = [f"# gpuagent real-GPU check, {document['started_at']}", ""]
    if document["backend"] == "nvml":
        lines.append(f"Backend **nvml**: {facts.get('gpus')} x {facts.get('gpu_name')}, "
                     f"driver {facts.get('driver')}.")
    else:
        lines.append(f"Backend **sim** (the simulated H100; hardware-only items say *needs GPU*). "
                     f"GPU: {facts.get('gpu_reason', 'none found')}.")
    lines += [
        f"Machine: Python {facts.get('python')}, {facts.get('cpus')} CPUs, kernel {facts.get('kernel')}, "
        f"torch {facts.get('torch') or 'absent'}, "
        f"nvidia-smi {'found' if facts.get('nvidia_smi') else 'absent'}, "
        f"cgroups {'usable' if not facts.get('cgroups') else 'unusable: ' + str(facts['cgroups'])}.",
        f"Command: `{document['command']}`" + (" (quick)" if document.get("quick") else ""),
        f"Took {document['elapsed_s']:.0f} s of a {document['deadline_s']:.0f} s deadline. "
        + ", ".join(f"{n} {k}" for k, n in sorted(document["summary"].items())) + ".",
        "",
        "| item | result | seconds (budget) | why |",
        "| --- | --- | --- | --- |",
    ]
    for item in document["items"]:
        status = STATUS_WORD.get(item["status"], item["status"])
        lines.append(f"| {item['name']} | {status} | {item['seconds']:.0f} ({item['budget_s']:.0f}) | "
                     f"{_cell(item['reason'])} |")
    for item in document["items"]:
        status = STATUS_WORD.get(item["status"], item["status"])
        lines += ["", f"## {item['name']}: {item['title']} ({status})", ""]
        if item["reason"]:
            lines += [item["reason"], ""]
        if item["checks"]:
            lines += ["| check | value | bar | expected | result |", "| --- | --- | --- | --- | --- |"]
            for check in item["checks"]:
                expected = "" if check["expected"] is None else _cell(check["expected"])
                verdict = _verdict(check["passed"]) + (f" ({check['note']})" if check["note"] else "")
                lines.append(f"| {_cell(check['name'], 70)} | {_cell(check['value'])} | {check['bar']} | "
                             f"{expected} | {verdict} |")
        if item.get("text"):
            lines += ["", item["text"]]
    clean = document["cleanup"] or "Everything started was stopped; no cgroup left."
    lines += ["", "## Cleanup", "", clean, ""]
    return "\n".join(lines)
