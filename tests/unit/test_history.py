"""The shared history format: round trips, streaming and validation errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bkref.linearizability.history import (
    NEMESIS,
    HistoryError,
    Op,
    OpType,
    Recorder,
    pair,
    validate,
)
from bkref.linearizability.history_files import (
    JsonlWriter,
    iter_jsonl,
    nonempty,
    read_history,
    read_jsonl,
    read_parquet,
    write_jsonl,
    write_parquet,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def histories(draw: st.DrawFn) -> list[Op]:
    """Valid histories: processes invoke and complete one op at a time, plus nemesis ops."""
    n_steps = draw(st.integers(0, 40))
    open_ops: dict[int, Op] = {}
    next_process = 0
    idle: list[int] = []
    ops: list[Op] = []
    index = 0
    t = 0
    for _ in range(n_steps):
        index += draw(st.integers(1, 3))
        t += draw(st.integers(0, 10**6))
        choice = draw(st.sampled_from(["invoke", "complete", "nemesis"]))
        if choice == "complete" and open_ops:
            p = draw(st.sampled_from(sorted(open_ops)))
            inv = open_ops.pop(p)
            typ: OpType = draw(st.sampled_from(["ok", "fail", "info"]))
            ledger = inv.ledger if inv.ledger is not None else draw(st.none() | st.integers(0, 9))
            ops.append(Op(index, t, p, typ, inv.f, ledger, draw(json_values)))
            if typ != "info":
                idle.append(p)
        elif choice == "nemesis":
            ops.append(Op(index, t, NEMESIS, "info", "kill", None, draw(json_values)))
        else:
            reuse: bool = draw(st.booleans())
            if idle and reuse:
                p = idle.pop(0)
            else:
                p, next_process = next_process, next_process + 1
            f = draw(st.sampled_from(["add", "read", "read_lac", "close", "recover", "create"]))
            ledger = None if f == "create" else draw(st.integers(0, 9))
            op = Op(index, t, p, "invoke", f, ledger, draw(json_values))
            open_ops[p] = op
            ops.append(op)
    return ops


@settings(max_examples=150, deadline=None)
@given(histories())
def test_generated_histories_are_valid(ops: list[Op]) -> None:
    assert list(validate(ops)) == ops


@settings(max_examples=60, deadline=None)
@given(histories())
def test_jsonl_round_trip(tmp_path_factory: pytest.TempPathFactory, ops: list[Op]) -> None:
    path = tmp_path_factory.mktemp("h") / "h.jsonl"
    assert write_jsonl(ops, path) == len(ops)
    assert list(read_jsonl(path)) == ops


@settings(max_examples=40, deadline=None)
@given(histories())
def test_jsonl_parquet_jsonl_round_trip(
    tmp_path_factory: pytest.TempPathFactory, ops: list[Op]
) -> None:
    d = tmp_path_factory.mktemp("h")
    write_jsonl(ops, d / "a.jsonl")
    write_parquet(read_history(d / "a.jsonl"), d / "b.parquet")
    assert list(read_parquet(d / "b.parquet")) == ops
    write_jsonl(read_history(d / "b.parquet"), d / "c.jsonl")
    assert (d / "a.jsonl").read_text() == (d / "c.jsonl").read_text()


def test_parquet_streams_in_row_groups_and_reads_a_directory(tmp_path: Path) -> None:
    ops = [Op(i, i, NEMESIS, "info", "pause", None, {"node": i}) for i in range(1000)]
    (tmp_path / "d").mkdir()
    write_parquet(ops[:600], tmp_path / "d" / "part-0.parquet", batch_size=128)
    write_parquet(ops[600:], tmp_path / "d" / "part-1.parquet", batch_size=128)
    assert list(read_history(tmp_path / "d")) == ops


def test_pairing_keeps_invocation_order_and_unknown_outcomes() -> None:
    ops = [
        Op(0, 0, 1, "invoke", "add", 5, {"entry": 0, "data": "a"}),
        Op(1, 1, 2, "invoke", "read", 5, {"entry": 0}),
        Op(2, 2, NEMESIS, "info", "kill", None, "bookie-1"),
        Op(3, 3, 2, "ok", "read", 5, {"entry": 0, "found": False}),
        Op(4, 4, 1, "info", "add", 5, None),
        Op(5, 5, 3, "invoke", "create", None, {"ensemble": 3}),
        Op(6, 6, 3, "ok", "create", 9, {"ensemble": 3}),
        Op(7, 7, 4, "invoke", "close", 5, None),
    ]
    paired = pair(validate(ops))
    assert [(o.process, o.f, o.status) for o in paired] == [
        (1, "add", "info"),
        (2, "read", "ok"),
        (3, "create", "ok"),
        (4, "close", "info"),
    ]
    assert paired[1].call == 1
    assert paired[1].ret == 3
    assert paired[0].ret == float("inf")
    assert paired[3].ret == float("inf")
    assert paired[2].ledger == 9


def _lines(*objs: object) -> str:
    return "".join(json.dumps(o) + "\n" for o in objs)


def _op(
    index: int, process: object, typ: str, f: str = "add", ledger: object = 1
) -> dict[str, object]:
    return {
        "index": index,
        "time": index,
        "process": process,
        "type": typ,
        "f": f,
        "ledger": ledger,
        "value": None,
    }


@pytest.mark.parametrize(
    ("lines", "line", "message"),
    [
        ([_op(0, 1, "begin")], 1, "unknown type 'begin'"),
        ([{**_op(0, 1, "invoke"), "type": ["ok"]}], 1, "unknown type ['ok']"),
        ([_op(0, 1, "ok")], 1, "completion without invocation"),
        (
            [_op(0, 1, "invoke"), _op(1, 1, "invoke", "read")],
            2,
            "two open invocations on process 1",
        ),
        ([_op(5, 1, "invoke"), _op(5, 1, "ok")], 2, "non-monotonic index: 5 after 5"),
        ([_op(0, 1, "invoke"), _op(1, 1, "ok", "read")], 2, "does not match the invocation 'add'"),
        ([_op(0, 1, "invoke"), _op(1, 1, "ok", ledger=2)], 2, "names ledger 2"),
        ([_op(0, 1, "invoke"), _op(1, 1, "info"), _op(2, 1, "invoke")], 3, "process 1 is reused"),
        ([_op(0, -1, "invoke")], 1, "process must be a non-negative integer"),
        ([_op(0, True, "invoke")], 1, "process must be"),
        ([{**_op(0, 1, "invoke"), "extra": 1}], 1, "unknown field(s) ['extra']"),
        ([{"index": 0, "time": 0, "process": 1, "type": "invoke"}], 1, "missing field(s) ['f']"),
        ([_op(0, 1, "invoke", ledger="x")], 1, "ledger must be an integer or null"),
        ([[1, 2]], 1, "expected a JSON object"),
        ([{"format": "bkref-history", "version": 9}], 1, "version 9"),
    ],
)
def test_bad_lines_are_rejected_naming_line_and_reason(
    tmp_path: Path, lines: list[object], line: int, message: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(_lines(*lines))
    with pytest.raises(HistoryError) as info:
        list(read_jsonl(path))
    assert info.value.line == line
    assert message in str(info.value)
    assert str(info.value).startswith(f"{path} line {line}: ")


def test_invalid_json_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(_lines(_op(0, 1, "invoke")) + '{"index": 1,\n')
    with pytest.raises(HistoryError, match=r"line 2: not valid JSON"):
        list(read_jsonl(path))


def test_reader_streams_the_valid_prefix_before_an_error(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text(_lines(_op(0, 1, "invoke"), _op(1, 1, "ok"), _op(2, 7, "fail")))
    seen: list[Op] = []
    with pytest.raises(HistoryError, match="line 3"):
        seen.extend(read_jsonl(path))
    assert [op.index for op in seen] == [0, 1]


def test_recorder_assigns_increasing_index_and_time(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    with JsonlWriter(path) as w:
        rec = Recorder(w)
        inv = rec.invoke(0, "create", None, {"ensemble": 3, "write_quorum": 2, "ack_quorum": 2})
        rec.record(NEMESIS, "info", "kill", None, "bookie-2")
        rec.complete(inv, "ok", {"ensemble": 3, "write_quorum": 2, "ack_quorum": 2}, ledger=4)
    ops = list(read_jsonl(path))
    assert [op.index for op in ops] == [0, 1, 2]
    assert ops[0].time <= ops[1].time <= ops[2].time
    assert ops[2].ledger == 4
    assert ops[2].type == "ok"
    with pytest.raises(ValueError, match="not invoke"):
        rec.complete(inv, "invoke")


def test_bytes_that_are_not_utf8_name_their_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    good = _lines(_op(0, 1, "invoke"), _op(1, 1, "ok")).encode()
    path.write_bytes(good + b'{"index": 2, "f": "\xff"}\n' + good)
    with pytest.raises(HistoryError) as info:
        list(read_jsonl(path))
    assert info.value.line == 3
    assert str(info.value).startswith(f"{path} line 3: not UTF-8 text (byte 0xff")


def test_a_text_stream_that_is_not_utf8_is_a_history_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\x80" * 10)
    with path.open(encoding="utf-8") as stream, pytest.raises(HistoryError, match="not UTF-8"):
        list(iter_jsonl(stream, source="s"))


def test_a_missing_file_is_a_history_error(tmp_path: Path) -> None:
    for name in ("none.jsonl", "none.parquet"):
        with pytest.raises(HistoryError, match=f"(?i){name}: .*no such file or directory"):
            list(read_history(tmp_path / name))


def test_a_file_that_is_not_parquet_is_a_history_error(tmp_path: Path) -> None:
    path = tmp_path / "h.parquet"
    path.write_bytes(b"PAR1 not really")
    with pytest.raises(HistoryError, match=r"h.parquet: not a readable Parquet file \("):
        list(read_history(path))


def test_a_parquet_value_that_is_not_json_names_file_and_row(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    ops = [Op(0, 0, 1, "invoke", "add", 1, {"entry": 0, "data": "a"})]
    write_parquet(ops, tmp_path / "a.parquet")
    table = pq.read_table(tmp_path / "a.parquet")
    table = table.set_column(6, "value", pa.array(["{not json"], pa.string()))
    pq.write_table(table, tmp_path / "b.parquet")
    with pytest.raises(HistoryError, match=r"b.parquet line 1: value is not valid JSON"):
        list(read_history(tmp_path / "b.parquet"))


def test_nonempty_passes_ops_through_and_rejects_an_empty_history() -> None:
    ops = [Op(0, 0, 1, "invoke", "add", 1, None)]
    assert list(nonempty(ops, "h")) == ops
    with pytest.raises(HistoryError, match=r"^h: no operations: .*; say so") as info:
        list(nonempty([], "h", hint="; say so"))
    assert info.value.line is None
