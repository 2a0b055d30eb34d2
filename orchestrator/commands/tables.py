"""The text `orch status`, `orch list`, `orch top` and `orch doctor` print: tables of the job's status model
(orchestrator/status.py), of its metrics (orchestrator/top.py) and of its checks (orchestrator/doctor.py).
`-o json` prints the models themselves; this is only their text form.

Every line of `orch status` and `orch list` goes through `redaction.shown`: what a server or a job's free text
holds cannot add lines (or colours) to orch's output.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from orchestrator.redaction import shown

if TYPE_CHECKING:
    from orchestrator import top
    from orchestrator.doctor import Check
    from orchestrator.status import JobStatus, Straggler


def table(rows: list[list[str]]) -> str:
    """Left-aligned columns separated by three spaces, like kubectl."""
    if not rows:
        return ""
    rows = [[shown(str(cell)) for cell in row] for row in rows]  # a cell is one line, whatever it holds
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def format_status(status: JobStatus) -> str:
    lines = [
        f"Name:        {status.name}",
        f"Namespace:   {status.namespace}",
        f"Kind:        {status.kind}",
        f"Phase:       {status.phase}" + (f" ({status.reason})" if status.reason else ""),
    ]
    if status.message:
        lines.append(f"Message:     {status.message}")
    lines += [f"Started:     {status.start_time or '-'}", f"Completed:   {status.completion_time or '-'}"]
    lines.append(f"Restarts:    {status.restarts}")
    lines += format_waiting(status.waiting)
    lines += [f"Tracking:    {sink} {where}" for sink, where in status.tracking.items()]
    if status.output_url:
        lines.append(f"Output:      {status.output_url} (checkpoints, model.pt, summary.json)")
    if status.replicas:
        lines += ["", "Replicas:"]
        rows = [["ROLE", "ACTIVE", "SUCCEEDED", "FAILED"]]
        rows += [
            [role, str(r.active), str(r.succeeded), str(r.failed)] for role, r in status.replicas.items()
        ]
        lines += ["  " + line for line in table(rows).splitlines()]
    lines += ["", "Pods:"]
    if status.pods:
        rows = [["POD", "ROLE", "PHASE", "NODE", "RESTARTS", "LAST TERMINATION"]]
        rows += [
            [p.name, p.label, p.phase, p.node or "-", str(p.restarts), p.last_termination or "-"]
            for p in status.pods
        ]
        lines += ["  " + line for line in table(rows).splitlines()]
    else:
        lines.append("  (none yet)")
    if status.suspected_nodes:
        lines += ["", "Suspected nodes (hardware; `orch submit --replace` keeps the next job off them):"]
        rows = [["NODE", "POD", "RANK", "GPU", "WHY"]]
        rows += [
            [s.node or "?", s.pod or "-", str(s.rank) if s.rank >= 0 else "-", s.gpu or "-", s.reason]
            for s in status.suspected_nodes
        ]
        lines += ["  " + line for line in table(rows).splitlines()]
    if status.events:
        lines += ["", "Warning events:"]
        rows = [["TIME", "OBJECT", "REASON", "MESSAGE"]]
        rows += [[e["time"], e["object"], e["reason"], e["message"]] for e in status.events[-10:]]
        lines += ["  " + line for line in table(rows).splitlines()]
    lines += goodput_lines(status)
    if status.straggler:  # last: the one thing to act on while the job runs
        lines.append(straggler_line(status.straggler, status.name))
    return "\n".join(shown(line) for line in lines)


def goodput_lines(status: JobStatus) -> list[str]:
    """Where the job's time went (#31): its milestones since creation, its goodput (from the journal in
    output.url) or why it is not known, and a rank's hang verdict."""
    from orchestrator import goodput
    from orchestrator.kube import read

    lines = []
    created = read.parse_time(status.milestones.get("created"))
    if created is not None:
        steps = []
        for key, words in (
            ("admitted", "admitted"),
            ("pods_ready", "pods ready"),
            ("first_step", "first step"),
        ):
            when = read.parse_time(status.milestones.get(key))
            if when is not None:
                steps.append(f"{words} +{max(0, round((when - created).total_seconds()))} s")
        lines.append(
            "Timeline:    created " + status.milestones["created"] + "".join(f", {s}" for s in steps)
        )
    if status.goodput is not None:
        lines.append(f"Goodput:     {goodput.line(status.goodput)}")
    elif status.goodput_note:
        lines.append(f"Goodput:     {status.goodput_note}")
    if status.hang is not None:
        lines.append(f"Hang:        {status.hang['line']} (every rank's stack: orch logs {status.name})")
    return lines


def straggler_line(straggler: Straggler, job: str) -> str:
    """The last line of `orch status` for a job whose ranks all wait for one."""
    places = (
        f"pod {straggler.pod}" if straggler.pod else "",
        f"host {straggler.hostname}" if straggler.hostname else "",
    )
    where = ", ".join(p for p in places if p)
    return (
        f"straggler: rank {straggler.rank}" + (f" ({where})" if where else "") + f" takes "
        f"{straggler.seconds:.3f}s per step to reach the gradient reduction, the job's median "
        f"{straggler.median_seconds:.3f}s: every other rank waits for it (orch top {job})"
    )


def format_waiting(waiting: dict[str, Any]) -> list[str]:
    """The "Queue:" lines of `orch status`."""
    if not waiting:
        return []
    if waiting["scheduler"] == "Kueue":
        where = f"Kueue LocalQueue {waiting['queue']}"
        if waiting["workload"]:
            where += f", Workload {waiting['workload']}: " + (
                "admitted" if waiting["admitted"] else "not admitted"
            )
            if waiting["cluster_queue"]:
                where += f" (ClusterQueue {waiting['cluster_queue']})"
        else:
            where += ": no Workload yet (is Kueue's integration for this kind enabled?)"
        if waiting["pending_in_queue"] is not None:
            where += f"; {waiting['pending_in_queue']} workload(s) pending in the queue"
    else:
        where = f"Volcano PodGroup {waiting['podgroup']}: {waiting['phase'] or 'no phase yet'}"
        if waiting["queue"]:
            where += f" (queue {waiting['queue']})"
    lines = [f"Queue:       {where}"]
    for c in waiting["conditions"]:
        because = f" {c['reason']}" if c["reason"] else ""
        lines.append(f"  {c['type']}={c['status']}{because}" + (f": {c['message']}" if c["message"] else ""))
    return lines


def format_list(rows: list[dict[str, Any]], *, wide: bool = False, all_namespaces: bool = False) -> str:
    header = (["NAMESPACE"] if all_namespaces else []) + ["NAME", "KIND", "PHASE", "AGE", "NODES x GPUS"]
    if wide:
        header += ["REASON", "CREATED"]
    out = [header]
    for r in rows:
        line = ([r["namespace"]] if all_namespaces else []) + [
            r["name"],
            r["kind"],
            r["phase"],
            r["age"] or "-",
            f"{r['nodes']} x {r['gpus_per_node']}",
        ]
        if wide:
            line += [r["reason"] or "-", r["created"] or "-"]
        out.append(line)
    return table(out)


# --- `orch top` ---------------------------------------------------------------------------------------------


def _number(value: float | None, fmt: str) -> str:
    if value is None:
        return "-"
    if math.isnan(value) or math.isinf(value):
        return str(value)
    return format(value, fmt)


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**30:.1f}"


def format_top(rows: list[top.Row]) -> str:
    """`orch top`'s table: a row per rank (and per GPU no rank claims)."""
    header = ("RANK", "NODE", "HOST", "GPU", "UTIL", "MEM GiB", "POWER W", "STEP", "SAMPLES/S", "LOSS")
    lines = [header]
    for row in rows:
        memory = "-"
        if row.memory_used_bytes is not None:
            memory = _gib(row.memory_used_bytes) + (
                "/" + _gib(row.memory_total_bytes) if row.memory_total_bytes else ""
            )
        lines.append(
            (
                "-" if row.rank is None else str(row.rank),
                row.node_rank or "-",
                row.hostname or "-",
                row.gpu or "-",
                "-" if row.gpu_utilization is None else f"{row.gpu_utilization:.0%}",
                memory,
                _number(row.power_watts, ".0f"),
                _number(row.step, ".0f"),
                _number(row.samples_per_second, ".1f"),
                _number(row.loss, ".4g"),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def format_summary(summary: top.Summary) -> str:
    """`orch top` past a screen of ranks: the job's totals, the spread over its ranks, the worst ranks."""
    head = (
        f"job {summary.job}: {summary.ranks} ranks, step {_number(summary.step, '.0f')}, "
        f"{_number(summary.samples_per_second, '.1f')} samples/s"
        + (f", MFU {summary.mfu:.0%}" if summary.mfu is not None else "")
        + (
            f", GPU memory {_gib(summary.memory_used_bytes)} GiB"
            if summary.memory_used_bytes is not None
            else ""
        )
    )
    lines = [head, ""]
    rows: list[tuple[str, ...]] = [("", "MIN", "MEDIAN", "MAX")]
    from orchestrator.top import SPREAD

    labels = {name: label for name, label, _ in SPREAD}
    for name, spread in summary.spread.items():
        if spread.max is None:
            continue
        if name == "gpu_utilization":
            cells = [f"{v:.0%}" if v is not None else "-" for v in (spread.min, spread.median, spread.max)]
        elif name == "memory_used_bytes":
            cells = [_gib(v) for v in (spread.min, spread.median, spread.max)]
        else:
            cells = [_number(v, ".3f") for v in (spread.min, spread.median, spread.max)]
        rows.append((labels.get(name, name), *cells))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    for title, ranked in (
        ("slowest to the gradient reduction (stragglers hold every other rank)", summary.slowest),
        ("longest since their last step", summary.stopped),
    ):
        if not ranked:
            continue
        lines += ["", title + ":"]
        table = [("RANK", "NODE", "POD", "HOST", "SECONDS")] + [
            (r.rank, r.node_rank or "-", r.pod or "-", r.hostname or "-", f"{r.value:.3f}") for r in ranked
        ]
        widths = [max(len(t[i]) for t in table) for i in range(5)]
        lines += ["  ".join(c.ljust(w) for c, w in zip(t, widths, strict=True)).rstrip() for t in table]
    lines += ["", f"(every rank: orch top {summary.job} --all)"]
    return "\n".join(lines)


def format_checks(checks: list[Check]) -> str:
    """`orch doctor`'s table: one line per check (its fix below a WARN or FAIL), then the counts."""
    from orchestrator.doctor import FAIL, OK, WARN

    width = max(len(check.name) for check in checks)
    lines = []
    for check in checks:
        line = f"{check.status:<4}  {check.name:<{width}}  {check.detail}"
        if check.fix and check.status != OK:
            line += f"\n      {'':<{width}}  fix: {check.fix}"
        lines.append(line)
    failed = sum(check.status == FAIL for check in checks)
    warned = sum(check.status == WARN for check in checks)
    lines.append(f"{failed} failed, {warned} warnings, {len(checks) - failed - warned} ok")
    return "\n".join(lines)
