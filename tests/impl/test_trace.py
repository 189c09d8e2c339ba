"""Protocol traces (bkref.impl.trace): one JSON line per step, numbered per node, whole
lines only, safe across threads, and what a SIGKILL leaves."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

from bkref.impl.trace import Tracer, trace_path


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_each_step_is_a_line_with_node_seq_action_and_arguments(tmp_path: Path) -> None:
    with Tracer(tmp_path, "127.0.0.1:3181") as t:
        t.step("bookie_handles_add", ledger=3, entry=0, status="OK")
        t.step("bookie_handles_add", ledger=3, entry=1, status="FENCED")
    path = trace_path(tmp_path, "127.0.0.1:3181")
    assert path.name == "trace-127.0.0.1_3181.jsonl"
    lines = _lines(path)
    assert [(x["seq"], x["action"], x["entry"], x["status"]) for x in lines] == [
        (0, "bookie_handles_add", 0, "OK"),
        (1, "bookie_handles_add", 1, "FENCED"),
    ]
    assert {x["node"] for x in lines} == {"127.0.0.1:3181"}
    t0, t1 = lines[0]["t"], lines[1]["t"]
    assert isinstance(t0, int)
    assert isinstance(t1, int)
    assert t0 <= t1


def test_a_restarted_node_continues_its_numbering_and_drops_a_cut_last_line(
    tmp_path: Path,
) -> None:
    with Tracer(tmp_path, "b") as t:
        t.step("bookie_handles_add", entry=0)
    path = trace_path(tmp_path, "b")
    with path.open("a") as f:
        f.write('{"node":"b","seq":1,"act')  # the crash cut this line short
    with Tracer(tmp_path, "b") as t:
        t.step("bookie_restarts")
    assert [(x["seq"], x["action"]) for x in _lines(path)] == [
        (0, "bookie_handles_add"),
        (1, "bookie_restarts"),
    ]


def test_steps_from_many_threads_get_distinct_consecutive_numbers(tmp_path: Path) -> None:
    with Tracer(tmp_path, "client") as t:

        def work(n: int) -> None:
            for i in range(200):
                t.step("writer_sends_add", thread=n, i=i)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    lines = _lines(trace_path(tmp_path, "client"))
    assert [x["seq"] for x in lines] == list(range(1600))
    for n in range(8):  # each thread's own steps stay in its order
        assert [x["i"] for x in lines if x["thread"] == n] == list(range(200))


def test_a_node_killed_with_sigkill_leaves_every_step_it_logged(tmp_path: Path) -> None:
    code = (
        "import sys, pathlib\n"
        "from bkref.impl.trace import Tracer\n"
        "t = Tracer(pathlib.Path(sys.argv[1]), 'w')\n"
        "for i in range(500):\n"
        "    t.step('writer_sends_add', entry=i)\n"
        "print('logged', flush=True)\n"
        "sys.stdin.read()\n"  # wait to be killed, without closing the tracer
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "logged\n"
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    proc.stdout.close()
    assert proc.stdin is not None
    proc.stdin.close()
    assert [x["entry"] for x in _lines(trace_path(tmp_path, "w"))] == list(range(500))
