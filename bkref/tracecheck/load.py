"""Reading a run's trace files: one ``trace-<node>.jsonl`` per node, one JSON line per step.

A line is ``{"node", "seq", "t", "action", ...arguments}`` (``bkref.impl.trace``). Four kinds
of line are not steps: ``connected`` (a client's connection to a bookie opened; it names
the client's end, so that the bookie's ``peer`` and a request id name one request of one
client), ``replacement`` (the bookie chosen for an ensemble change logged when it was
decided), ``stopped`` (a recovery gave up) and ``registered`` (a bookie registered in
ZooKeeper, which ends what the auditor saw as its loss).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TRACE_GLOB = "trace-*.jsonl"
CONNECTED = "connected"
REPLACEMENT = "replacement"  # names the new bookie of an ensemble change logged before
STOPPED = "stopped"  # a recovery gave up: it takes no more steps
REGISTERED = "registered"  # a bookie registered in ZooKeeper (again, after its session expired)


class TraceError(ValueError):
    """A trace directory or file that cannot be read (the message says where and why)."""


@dataclass(frozen=True)
class Line:
    node: str
    seq: int
    t: int
    action: str
    args: dict[str, Any] = field(hash=False, compare=False)

    def __getitem__(self, key: str) -> Any:  # noqa: ANN401 - a JSON value
        return self.args[key]

    def get(self, key: str, default: object = None) -> Any:  # noqa: ANN401 - a JSON value
        return self.args.get(key, default)

    def where(self) -> str:
        return f"{self.node} #{self.seq}"


def read_file(path: Path) -> list[Line]:
    """The lines of one node's trace file. A last line without its newline was cut by a
    crash (the step was not wholly logged) and is dropped; any other bad line is an error."""
    out: list[Line] = []
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    elif lines:
        lines.pop()  # cut short by a crash
    for no, raw in enumerate(lines, 1):
        try:
            d = json.loads(raw)
            line = Line(
                str(d.pop("node")), int(d.pop("seq")), int(d.pop("t")), str(d.pop("action")), d
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise TraceError(
                f"{path}:{no}: not a trace line ({e}); expected a JSON object with node, "
                "seq, t and action"
            ) from None
        if line.seq != len(out):
            raise TraceError(
                f"{path}:{no}: step number {line.seq}, expected {len(out)}: lines are "
                "missing or out of order (was the file edited?)"
            )
        out.append(line)
    return out


def read_dir(directory: Path) -> dict[str, list[Line]]:
    """Every node's lines, by node name."""
    if not directory.is_dir():
        raise TraceError(f"{directory}: no such directory (pass a run's trace directory)")
    files = sorted(directory.glob(TRACE_GLOB))
    if not files:
        raise TraceError(
            f"{directory}: no {TRACE_GLOB} files; run the nodes with --trace DIR "
            "(or a campaign with --trace) to record traces"
        )
    nodes: dict[str, list[Line]] = {}
    for f in files:
        lines = read_file(f)
        if lines:
            nodes[lines[0].node] = lines
    return nodes
