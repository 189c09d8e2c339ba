"""Reading trace files: bad input is a clear error (exit 2, one line), a line cut short
by a crash is dropped, and a directory without traces says how to record them."""

from __future__ import annotations

from pathlib import Path

import pytest

from bkref.tracecheck.cli import main
from bkref.tracecheck.load import TraceError, read_dir, read_file

GOOD = (
    '{"node":"w","seq":0,"t":5,"action":"writer_creates_ledger","ledger":1,'
    '"ensemble":["b0","b1"],"write_quorum":2,"ack_quorum":2,"version":0}\n'
)


def test_a_last_line_cut_short_by_a_crash_is_dropped(tmp_path: Path) -> None:
    f = tmp_path / "trace-w.jsonl"
    f.write_text(GOOD + '{"node":"w","seq":1,"t":9,"act')
    lines = read_file(f)
    assert [(x.node, x.seq, x.action) for x in lines] == [("w", 0, "writer_creates_ledger")]
    assert lines[0]["ensemble"] == ["b0", "b1"]


def test_a_bad_line_names_its_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "trace-w.jsonl"
    f.write_text(GOOD + "not json\n" + GOOD)
    with pytest.raises(TraceError, match=r"trace-w\.jsonl:2: not a trace line"):
        read_file(f)


def test_lines_out_of_order_are_an_error(tmp_path: Path) -> None:
    f = tmp_path / "trace-w.jsonl"
    f.write_text(GOOD + GOOD)  # two lines numbered 0
    with pytest.raises(TraceError, match="step number 0, expected 1"):
        read_file(f)


def test_a_directory_without_traces_says_how_to_record_them(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="--trace"):
        read_dir(tmp_path)


@pytest.mark.parametrize("make", ["missing", "bad line"])
def test_bad_input_exits_2_with_one_line_and_no_traceback(
    tmp_path: Path, make: str, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "traces"
    if make == "bad line":
        d.mkdir()
        (d / "trace-w.jsonl").write_text("{}\n")
    assert main(["check", str(d)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bkref trace check: ")
    assert err.count("\n") == 1
    assert "Traceback" not in err


def test_a_ledger_created_by_no_traced_client_is_unknown_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "traces"
    d.mkdir()
    (d / "trace-b0.jsonl").write_text(
        '{"node":"b0","seq":0,"t":1,"action":"bookie_handles_add","bookie":"b0","ledger":4,'
        '"entry":0,"recovery":false,"rid":1,"peer":"c:1","status":"OK"}\n'
    )
    assert main(["check", str(d)]) == 2
    out = capsys.readouterr().out
    assert "ledger 4: unknown: created by a client that left no trace" in out


def test_the_link_lines_are_named_alike_in_the_implementation_and_the_checker() -> None:
    from bkref.impl import trace
    from bkref.tracecheck import load

    names = ("CONNECTED", "REPLACEMENT", "STOPPED", "REGISTERED")
    assert [getattr(trace, n) for n in names] == [getattr(load, n) for n in names]
