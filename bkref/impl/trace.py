"""Protocol traces: the steps a node takes, named as the spec names its actions.

A node (a bookie, a client, an AutoRecovery process, the nemesis) that is given a
:class:`Tracer` writes one JSON line per protocol step it takes, to a file of its own::

    {"node": "bookie-1", "seq": 17, "t": 5123456789, "action": "bookie_handles_add",
     "ledger": 12, "entry": 40, "bookie": "127.0.0.1:3181", ...}

- ``action``: the name of the spec's action the step is (``bkref.spec.protocol.ACTIONS``;
  ``impl`` does not import the spec, a test holds the names equal);
- ``seq``: the node's own order of its steps, from 0;
- ``t``: the node's monotonic clock in nanoseconds. ``seq`` orders a node's own steps;
  the check compares ``t`` across nodes too (which client opened a connection, which
  answer came first), so a run's nodes must share one monotonic clock: processes of one
  host, and containers without a time namespace of their own (Docker makes none);
- the rest: the arguments the spec's action takes, in real names (ledger ids, bookie ids,
  entry ids, metadata versions), and what links a step to steps of other nodes (request
  ids, metadata versions).

``bkref trace check`` merges a run's files and replays them through the spec
(docs/notes/trace-validation.md). Tracing is off unless a node is given a tracer: call
sites test ``tracer is not None`` first, so the add path pays one comparison.
Every line is written through at once (line-buffered), so a node killed with SIGKILL
leaves every step it logged.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

TRACE_PREFIX = "trace-"  # trace-<node>.jsonl in a run's trace directory
# Lines that are no spec step, only links between steps (bkref.tracecheck.load has the
# same names; it may not import impl): a client's connection opened (its own address),
# the bookie chosen for an ensemble change logged earlier, a recovery that gave up, a
# bookie registered in ZooKeeper (at its start, and again after its session expired).
CONNECTED, REPLACEMENT, STOPPED = "connected", "replacement", "stopped"
REGISTERED = "registered"


def trace_path(directory: Path, node: str) -> Path:
    """The trace file of ``node`` in ``directory`` (``/`` and ``:`` in the name made safe)."""
    safe = node.replace("/", "_").replace(":", "_")
    return directory / f"{TRACE_PREFIX}{safe}.jsonl"


def _complete_lines(path: Path) -> int:
    """The complete lines of an existing trace file; a last line cut short by a crash
    is removed (that step was never wholly logged, so it counts as not logged)."""
    if not path.exists():
        return 0
    with path.open("r+b") as f:
        data = f.read()
        keep = data.rfind(b"\n") + 1
        if keep < len(data):
            f.truncate(keep)
        return data.count(b"\n", 0, keep)


class Tracer:
    """Writes one node's protocol steps; safe to share between the node's threads."""

    def __init__(self, directory: Path, node: str, *, new: bool = False) -> None:
        """``new``: the node must not have a file yet (FileExistsError if it has); the
        file is created, so two processes cannot both take the name."""
        directory.mkdir(parents=True, exist_ok=True)
        self.node = node
        self.path = trace_path(directory, node)
        if new:
            self.restarted = False
            self._seq = 0
            self._file = self.path.open("x", buffering=1, encoding="utf-8")
        else:
            # A restarted node (a bookie after a crash) continues its own file and
            # numbering. The file exists from a node's first start on: finding it, this
            # start is a restart.
            self.restarted = self.path.exists()
            self._seq = _complete_lines(self.path)
            self._file = self.path.open("a", buffering=1, encoding="utf-8")
        self._lock = threading.Lock()

    def step(self, action: str, **args: Any) -> None:  # noqa: ANN401 - JSON values
        """Log that this node took the spec step ``action`` with ``args``."""
        with self._lock:
            line = {"node": self.node, "seq": self._seq, "t": time.monotonic_ns()}
            line["action"] = action
            line.update(args)
            self._file.write(json.dumps(line, separators=(",", ":")) + "\n")
            self._seq += 1

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def new_node_tracer(directory: Path, prefix: str) -> Tracer:
    """A tracer for a process that is a new node at each start: ``<prefix>-<k>``, the
    first k = 0, 1, ... with no file in ``directory`` yet. Not named by the pid: a
    process in a container has the same pid at every start of the container."""
    k = 0
    while True:
        try:
            return Tracer(directory, f"{prefix}-{k}", new=True)
        except FileExistsError:
            k += 1
