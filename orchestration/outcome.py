"""What a scheduled retrain reports: which metrics it made, its summary, and the webhook.

A run publishes only what it produced (:func:`select_metrics`): a metrics file whose producing
stage ran in this run, or whose bytes are not the start commit's (a stage restored from DVC's
run cache). A run that stopped early publishes the stage that failed and nothing else, never
the committed files as if it had made them. The decision goes to the webhook the user
configured (:func:`notify`: one JSON POST, no retries; a failed POST is logged, not fatal).

Nothing here imports Prefect: the flow turns these into artifacts.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from typing import Any

#: Seconds the webhook may take to answer.
WEBHOOK_TIMEOUT_S = 10.0


def select_metrics(producers: Mapping[str, str], ran: Iterable[str],
                   differs: Callable[[str], bool]) -> dict[str, str]:
    """``{metrics file: why it is this run's}`` among ``producers`` (file -> stage).

    Args:
        producers: every declared metrics file and the stage that writes it.
        ran: the stages whose command ran in this run.
        differs: whether a file's bytes are not those of the run's start commit.
    """
    ran = set(ran)
    chosen: dict[str, str] = {}
    for path, stage in sorted(producers.items()):
        if stage in ran:
            chosen[path] = f"written by stage {stage} in this run"
        elif differs(path):
            chosen[path] = f"restored by stage {stage} from DVC's cache, new since the start commit"
    return chosen


def ran_stage(line: str) -> str | None:
    """The stage a ``dvc repro`` output line says it runs (``Running stage 'x':``), or None."""
    if line.startswith("Running stage '"):
        return line[len("Running stage '"):].split("'", 1)[0]
    return None


def table_markdown(rows: list[dict[str, Any]]) -> str:
    """A markdown table of dict rows (their keys, in order of first appearance)."""
    if not rows:
        return "(no rows)\n"
    columns = list(dict.fromkeys(k for row in rows for k in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    for row in rows:
        cells = [f"{v:.4g}" if isinstance(v, float) else "" if v is None else str(v)
                 for v in (row.get(c) for c in columns)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def summary_markdown(run: str, start: str, verdict: str, lines: list[str],
                     durations: Mapping[str, float], rows: list[dict[str, Any]]) -> str:
    """The run's markdown summary: the verdict, what happened, stage times and the gate table."""
    out = [f"# regrab-scheduled: {run}", "", f"**{verdict}**", "",
           f"- started from commit `{start[:12]}`"]
    out += [f"- {line}" for line in lines]
    if durations:
        out += ["", "| stage | seconds |", "| --- | ---: |"]
        out += [f"| {stage} | {sec:.1f} |" for stage, sec in durations.items()]
    if rows:
        out += ["", "## Champion against challenger (paired, points)", "", table_markdown(rows)]
    return "\n".join(out) + "\n"


def failure_markdown(run: str, start: str, stage: str, error: str, kept: str | None) -> str:
    """The summary of a run that stopped at ``stage``: no metrics, where to look."""
    out = [f"# regrab-scheduled: {run}", "", f"**failed at stage `{stage}`**", "",
           f"- started from commit `{start[:12]}`", f"- error: {error}",
           "- no metrics published: the run did not finish, and the committed files are "
           "not its results"]
    if kept:
        out.append(f"- workspace kept for inspection: `{kept}`")
    return "\n".join(out) + "\n"


def notify(url: str, payload: dict[str, Any], log: Callable[[str], Any],
           timeout_s: float = WEBHOOK_TIMEOUT_S) -> bool:
    """POST ``payload`` as JSON to ``url``; whether the receiver answered 2xx.

    A webhook that is down must not fail a retrain that finished: its error is logged.
    """
    if not url:
        return False
    body = json.dumps(payload, default=str).encode()
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            ok = 200 <= resp.status < 300
    except (urllib.error.URLError, OSError, ValueError) as exc:
        log(f"webhook {url} failed: {exc}")
        return False
    log(f"webhook {url} answered {resp.status}")
    return ok
