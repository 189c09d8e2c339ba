"""EDN: bkref histories exported as Jepsen's history.edn, read back, and checked the same."""

from __future__ import annotations

import io
import json
import random
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bkref.linearizability import edn, edn_history
from bkref.linearizability.anomalies import ANOMALY_KINDS
from bkref.linearizability.check_cli import main as check_main
from bkref.linearizability.cli import history_main
from bkref.linearizability.generate import ledger_history, many_ledgers, to_ops
from bkref.linearizability.history import JSON, HistoryError, Op, OpType
from bkref.linearizability.history_files import write_history
from bkref.linearizability.peer import sniff
from bkref.linearizability.plant import drop_final_reads, plant

# ---------------------------------------------------------------- histories to export

Event = tuple[int | str, OpType, str, int | None, JSON]


def object_history(
    rng: random.Random, model: str, *, ops: int = 40, keys: tuple[Any, ...] = (None,)
) -> list[Op]:
    """A linearizable register, cas-register or kv history, by simulation: three
    client processes, each op takes effect between its invocation and completion
    (a crash completes it as info, taken effect or not, and retires the process).
    ``keys``: registers per ledger id (None: one register), or kv keys."""
    kv = model == "kv"
    state: dict[Any, Any] = dict.fromkeys(keys, "" if kv else None)
    events: list[Event] = []
    free, next_p = [0, 1, 2], 3
    pending: list[dict[str, Any]] = []
    invoked = 0
    while invoked < ops or pending:
        if invoked < ops and free and (not pending or rng.random() < 0.4):
            p = free.pop(rng.randrange(len(free)))
            key = rng.choice(keys)
            fs = ["get", "put", "append"] if kv else ["read", "write"]
            f = rng.choice([*fs, "cas"] if model == "cas-register" else fs)
            if kv:
                arg: JSON = {"key": key, "value": None if f == "get" else f"{f}{invoked}"}
            else:
                v = rng.randrange(4)
                arg = None if f == "read" else [rng.choice([None, 0, 1, 2]), v] if f == "cas" else v
            ledger = None if kv else key
            events.append((p, "invoke", f, ledger, arg))
            pending.append({"p": p, "f": f, "key": key, "ledger": ledger, "arg": arg})
            invoked += 1
            continue
        a = rng.choice(pending)
        if rng.random() < 0.08:  # a crash: the outcome stays unknown
            if "out" not in a and rng.random() < 0.5:
                _apply(state, a, kv)
            pending.remove(a)
            events.append((a["p"], "info", a["f"], a["ledger"], None))
            free.append(next_p)
            next_p += 1
        elif "out" not in a:
            _apply(state, a, kv)
        else:
            pending.remove(a)
            events.append((a["p"], a["type"], a["f"], a["ledger"], a["out"]))
            free.append(a["p"])
    return to_ops(events)


def _apply(state: dict[Any, Any], a: dict[str, Any], kv: bool) -> None:
    key, f, arg = a["key"], a["f"], a["arg"]
    a["type"] = "ok"
    if kv:
        if f == "put":
            state[key] = arg["value"]
        elif f == "append":
            state[key] += arg["value"]
        a["out"] = {"key": key, "value": state[key]} if f == "get" else arg
    elif f == "read":
        a["out"] = state[key]
    elif f == "write":
        state[key] = arg
        a["out"] = arg
    else:
        if state[key] == arg[0]:
            state[key] = arg[1]
        else:
            a["type"] = "fail"
        a["out"] = arg


def plant_stale_read(ops: list[Op], model: str, key: Any) -> list[Op]:
    """``ops`` with a read of a value never written appended (not linearizable)."""
    p = 1000
    n = len(ops)
    if model == "kv":
        inv: JSON = {"key": key, "value": None}
        out: JSON = {"key": key, "value": "never written"}
        f, ledger = "get", None
    else:
        inv, out, f, ledger = None, 99, "read", key
    return [
        *ops,
        Op(n, 1000 * n, p, "invoke", f, ledger, inv),
        Op(n + 1, 1000 * (n + 1), p, "ok", f, ledger, out),
    ]


def ledger_ops(seed: int, kind: str | None) -> list[Op] | None:
    rng = random.Random(seed)
    ops = to_ops(ledger_history(rng, adds=10, reads=14, end="recover"))
    return ops if kind is None else plant(rng, ops, kind)


def with_nemesis(ops: list[Op]) -> list[Op]:
    """``ops`` with nemesis ops (info, as Jepsen's) at a third and two thirds, reindexed."""
    k, j = len(ops) // 3, 2 * len(ops) // 3
    start = Op(0, 0, "nemesis", "info", "partition", None, {"isolated": ["b1"], "event": "start"})
    stop = Op(0, 0, "nemesis", "info", "partition", None, {"done": True})
    merged = [*ops[:k], start, *ops[k:j], stop, *ops[j:]]
    return [op._replace(index=i, time=1000 * i) for i, op in enumerate(merged)]


# ---------------------------------------------------------------- helpers


def export(ops: list[Op], tmp_path: Path, model: str | None = None) -> tuple[Path, Path]:
    """Write ``ops`` as JSON Lines, export with `bkref history export`; both paths."""
    src, out = tmp_path / "h.jsonl", tmp_path / "h.edn"
    write_history(ops, src)
    argv = ["export", "--format", "edn", str(src), "-o", str(out)]
    assert history_main([*argv, *(["--model", model] if model else [])]) == 0
    return src, out


def check(path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any]:
    code = check_main([str(path), "--json", "--jobs", "1", *args])
    report = json.loads(capsys.readouterr().out)
    return code, _without_file_and_time(report)


def _without_file_and_time(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: _without_file_and_time(v) for k, v in value.items() if k not in ("file", "seconds")
        }
    if isinstance(value, list):
        return [_without_file_and_time(v) for v in value]
    return value


def kinds(report: Any) -> set[str]:
    (f,) = report["files"]
    found = set(f.get("anomaly_counts", {}))
    found |= {f"durability {k}" for k in f.get("durability", {}).get("counts", {})}
    found |= {f"key {p['key']} {p['verdict']}" for p in f.get("partitions", [])}
    return found


# ---------------------------------------------------------------- round trips per model

OBJECT_CASES = [
    ("register", (None,)),
    ("register", (1, 2, 3)),
    ("cas-register", (None,)),
    ("cas-register", (4, 5)),
    ("kv", ("a", "b", "c")),
]


@pytest.mark.parametrize(
    ("model", "keys"), OBJECT_CASES, ids=[f"{m}-{len(k)}" for m, k in OBJECT_CASES]
)
@pytest.mark.parametrize("planted", [False, True], ids=["valid", "stale-read"])
def test_object_histories_round_trip_with_the_same_verdict(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    model: str,
    keys: tuple[Any, ...],
    planted: bool,
) -> None:
    ops = object_history(random.Random(7), model, keys=keys)
    if planted:
        ops = plant_stale_read(ops, model, keys[0])
    src, out = export(ops, tmp_path)
    assert list(edn_history.read_edn(str(out), model=model)) == ops
    code, report = check(src, capsys, "--model", model)
    assert code == (1 if planted else 0)
    assert check(out, capsys, "--model", model) == (code, report)
    # without --model the EDN says which family it is; register vs cas-register
    # by whether a cas is there
    inferred = model if model != "cas-register" or any(op.f == "cas" for op in ops) else "register"
    code_inferred, report_inferred = check(out, capsys)
    assert report_inferred["files"][0]["model"] == inferred
    assert code_inferred == code
    assert kinds(report_inferred) == kinds(report)


def test_planted_read_makes_the_register_invalid_on_both_sides(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The planted anomaly is seen, and seen at the same op, in both formats."""
    ops = plant_stale_read(object_history(random.Random(3), "register"), "register", None)
    src, out = export(ops, tmp_path)
    _, a = check(src, capsys, "--model", "register")
    _, b = check(out, capsys)
    (part,) = b["files"][0]["partitions"]
    assert part["verdict"] == "invalid"
    assert part["blocked_op"] == len(ops) - 2  # the planted read
    assert a["files"][0]["partitions"] == b["files"][0]["partitions"]


LEDGER_CASES = [None, *ANOMALY_KINDS]


@pytest.mark.parametrize("kind", LEDGER_CASES, ids=[k or "valid" for k in LEDGER_CASES])
def test_ledger_histories_round_trip_with_the_same_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str | None
) -> None:
    ops = next(h for seed in range(60) if (h := ledger_ops(seed, kind)) is not None)
    ops = with_nemesis(ops)
    src, out = export(ops, tmp_path)
    assert list(edn_history.read_edn(str(out))) == ops
    code, report = check(src, capsys)
    assert code == (0 if kind is None else 1)
    if kind is not None:
        assert kind in report["files"][0]["anomaly_counts"] or kind in str(report)
    assert check(out, capsys) == (code, report)
    assert check(out, capsys, "--model", "ledger", "--engine", "search")[0] == code


def test_many_interleaved_ledgers_round_trip(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ops = many_ledgers(random.Random(5), 6, 60)
    src, out = export(ops, tmp_path)
    assert list(edn_history.read_edn(str(out))) == ops
    assert check(out, capsys) == check(src, capsys)


def test_index_gaps_are_renumbered_densely_and_the_rest_kept(tmp_path: Path) -> None:
    ops = ledger_ops(1, None)
    assert ops is not None
    gappy = drop_final_reads(ops, random.Random(1))
    assert [op.index for op in gappy] != list(range(len(gappy))), "the history needs a gap"
    _, out = export(gappy, tmp_path)
    back = list(edn_history.read_edn(str(out)))
    assert [op.index for op in back] == list(range(len(gappy)))
    assert [op._replace(index=0) for op in back] == [op._replace(index=0) for op in gappy]


def test_export_writes_jepsen_history_lines(tmp_path: Path) -> None:
    """Every line a map in jepsen.history.Op's field order, dense :index,
    non-decreasing :time, keywords for :type, :f and the nemesis."""
    ops = next(
        h
        for seed in range(60)
        if (h := ledger_ops(seed, None)) and any(o.type == "fail" for o in h)
    )
    ops = with_nemesis(ops)
    _, out = export(ops, tmp_path)
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(ops)
    last_time = -1
    for i, text in enumerate(lines):
        assert re.match(rf"\{{:index {i}, :time \d+, :type :(invoke|ok|fail|info), :process ", text)
        m = edn.loads(text)
        assert list(m)[:6] == [
            edn.Keyword(k) for k in ("index", "time", "type", "process", "f", "value")
        ]
        assert isinstance(m[edn.Keyword("f")], edn.Keyword)
        assert m[edn.Keyword("time")] >= last_time
        last_time = m[edn.Keyword("time")]
    assert (
        "{:index 0, :time 0, :type :invoke, :process 0, :f :create, :value [nil {:ensemble 3"
        in lines[0]
    )
    assert any(':process :nemesis, :f :partition, :value {:isolated ["b1"]' in t for t in lines)
    fenced = [t for t in lines if ":type :fail" in t]
    assert fenced, "a recovery fences the writer: some add fails"
    assert all(re.search(r":f :add, :value \[1 nil\], :error :fenced\}$", t) for t in fenced)
    assert sniff(out) == "edn"


def test_register_and_kv_value_shapes_are_jepsens() -> None:
    def line(op: Op, model: str, keyed: bool = False) -> str:
        buf = io.StringIO()
        edn_history.write_edn([op], buf, model, keyed=keyed)
        return buf.getvalue().split(":f ", 1)[1].strip()

    assert line(Op(0, 0, 1, "invoke", "read", None, None), "register") == ":read, :value nil}"
    assert line(Op(0, 0, 1, "ok", "cas", None, [1, 2]), "cas-register") == ":cas, :value [1 2]}"
    assert line(Op(0, 0, 1, "ok", "write", 3, 2), "register", True) == ":write, :value [3 2]}"
    assert (
        line(Op(0, 0, 1, "ok", "cas", 3, [1, 2]), "cas-register", True) == ":cas, :value [3 [1 2]]}"
    )
    kv_get = Op(0, 0, 1, "invoke", "get", None, {"key": "k", "value": None})
    assert line(kv_get, "kv") == ':get, :value ["k" nil]}'
    assert (
        line(Op(0, 0, 1, "ok", "read_lac", 7, {"lac": 3}), "ledger")
        == ":read_lac, :value [7 {:lac 3}]}"
    )


# ---------------------------------------------------------------- reading Jepsen's EDN


def test_a_whole_file_vector_with_comments_and_commas_is_read(tmp_path: Path) -> None:
    path = tmp_path / "knossos.edn"
    path.write_text(
        "; a Knossos-style history: one vector of maps\n"
        "[{:type :invoke, :f :write, :process 0, :value 3}\n"
        " {:type :ok,     :f :write, :process 0, :value 3} ; acknowledged\n"
        " #_{:type :invoke :f :read :process 9}\n"
        " {:type :invoke  :f :read   :process 1 :value nil}\n"
        " {:type :ok      :f :read   :process 1 :value 3}]\n",
        encoding="utf-8",
    )
    assert sniff(path) == "edn"
    ops = list(edn_history.read_edn(str(path)))
    assert [(op.index, op.time, op.process, op.type, op.f, op.value) for op in ops] == [
        (0, 2, 0, "invoke", "write", 3),
        (1, 3, 0, "ok", "write", 3),
        (2, 5, 1, "invoke", "read", None),
        (3, 6, 1, "ok", "read", 3),
    ]  # without :index and :time: op order, and the line number as time
    assert edn_history.edn_model(str(path)) == "register"


def test_jepsen_independent_registers_and_errors_are_read(tmp_path: Path) -> None:
    path = tmp_path / "history.edn"
    path.write_text(
        "{:index 0, :time 5, :type :invoke, :process 0, :f :cas, :value [4 [nil 1]]}\n"
        "{:index 1, :time 9, :type :info, :process 0, :f :cas, :value [4 nil], :error :timeout}\n"
        '{:index 2, :time 9, :type :info, :process :nemesis, :f :kill, :value ["n1" "n2"]}\n',
        encoding="utf-8",
    )
    assert list(edn_history.read_edn(str(path))) == [
        Op(0, 5, 0, "invoke", "cas", 4, [None, 1]),
        Op(1, 9, 0, "info", "cas", 4, {"error": "timeout"}),
        Op(2, 9, "nemesis", "info", "kill", None, ["n1", "n2"]),
    ]


BAD_OPS = [
    (
        '{:index 0, :time 0, :type :invoke, :process 0, :f :add, :value [1 {:data "a}]}\n',
        "unterminated string",
    ),
    ("{:index 0, :time 0, :type :invoke, :process 0, :f}\n", "odd number of forms"),
    (
        "{:index 0, :time 0, :type :started, :process 0, :f :read, :value nil}\n",
        "unknown :type :started",
    ),
    ("{:index 0, :time 0, :type :invoke, :f :read, :value nil}\n", "missing :process"),
    (
        "{:index 0, :time 0, :type :invoke, :process -1, :f :read, :value [1 nil]}\n",
        "process must be",
    ),
    ("{:index 0, :time 0, :type :invoke, :process 0, :value nil}\n", ":f must be a keyword"),
    ("#jepsen.history.Op{:index 0, :type :invoke, :process 0, :f :read}\n", "tagged element"),
    ("{:index 0, :time 0, :type :invoke, :process 0, :f :read, :value [1 2}\n", "does not close"),
    ("{:index 0, :time 0, :type :invoke, :process 0, :f :read, :value 017}\n", "number '017'"),
    ("[1 2]\n", "expected an op map"),
    (
        "{:index 0, :time 0, :type :invoke, :process 0, :f :add, :value 5}\n",
        "must be [ledger value]",
    ),
]


@pytest.mark.parametrize(("text", "message"), BAD_OPS, ids=[m for _, m in BAD_OPS])
def test_bad_edn_is_a_history_error_naming_the_line(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "bad.edn"
    good = "{:index 0, :time 0, :type :invoke, :process 7, :f :add, :value [1 nil]}\n"
    path.write_text(good + "\n" + text.replace(":index 0", ":index 1"), encoding="utf-8")
    with pytest.raises(
        HistoryError, match=rf"^{re.escape(str(path))} line 3: .*{re.escape(message)}"
    ):
        list(edn_history.read_edn(str(path), model="ledger"))


def test_bad_edn_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.edn"
    path.write_text(
        '{:index 0, :time 0, :type :invoke, :process 0, :f :read, :value "x}\n', encoding="utf-8"
    )
    assert check_main([str(path), "--model", "register"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"{path} line 1: unterminated string" in err


def test_parser_reads_every_edn_form() -> None:
    v = edn.loads(
        '{:s "a\\tb\\"c\\\\d\\u00e9", :i -42, :n 7N, :f 1.5e3, :m 2.5M, :nil nil, :t true,'
        " :v [1 [2]], :l (a b/c), :set #{1 2}, :ch [\\a \\newline \\u0041], :ns/kw :x.y/z}"
    )
    k = edn.Keyword
    assert v[k("s")] == 'a\tb"c\\dé'
    assert (v[k("i")], v[k("n")], v[k("f")], v[k("m")]) == (-42, 7, 1500.0, 2.5)
    assert v[k("nil")] is None
    assert v[k("t")] is True
    assert v[k("v")] == (1, (2,))
    assert v[k("l")] == edn.EdnList((edn.Symbol("a"), edn.Symbol("b/c")))
    assert v[k("set")] == frozenset({1, 2})
    assert v[k("ch")] == ("a", "\n", "A")
    assert v[k("ns/kw")] is k("x.y/z")
    assert edn.to_json(v[k("l")]) == ["a", "b/c"]
    assert edn.to_json(v[k("set")]) == [1, 2]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('"abc', "unterminated string"),
        ("{:a 1 :b}", "odd number of forms"),
        ("{:a 1 :a 2}", "duplicate key"),
        ("#{1 1}", "duplicate member"),
        ("[1 2", "unterminated vector"),
        (")", "nothing is open"),
        ('#inst "2020"', "tagged element '#inst'"),
        ("1/2", "cannot read the number"),
        ('"\\q"', "bad escape"),
        ("{{:a 1} 2}", "map cannot be a map key"),
        ("1 2", "expected one EDN form, found 2"),
    ],
)
def test_parser_refuses_bad_edn(text: str, message: str) -> None:
    with pytest.raises(HistoryError, match=re.escape(message)):
        edn.loads(text)


def test_error_lines_count_from_the_start_of_the_file() -> None:
    with pytest.raises(HistoryError, match=r"^edn line 4: unterminated map"):
        list(edn.iter_forms('{:a 1}\n\n; note\n{:b "x\ny"\n'))


# ---------------------------------------------------------------- export: bad input


def test_export_refuses_what_it_cannot_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "h.jsonl"
    back = [Op(0, 50, 0, "invoke", "read", None, None), Op(1, 10, 0, "ok", "read", None, 1)]
    write_history(back, src)
    assert history_main(["export", str(src), "--model", "register"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"bkref history: {src}: index 1: time goes back (10 ns after 50 ns); "
        "Jepsen's :time must not decrease\n"
    )
    bad_kv = [Op(0, 0, 0, "invoke", "put", None, {"k": "a"})]
    write_history(bad_kv, src)
    out = tmp_path / "out.edn"
    assert history_main(["export", str(src), "--model", "kv", "-o", str(out)]) == 2
    assert "a kv value must be {'key': k, 'value': v}" in capsys.readouterr().err
    assert not out.exists(), "a partial export is removed"
    assert history_main(["export", str(tmp_path / "none.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err.lower()
    (tmp_path / "empty.jsonl").write_text("", encoding="utf-8")
    assert history_main(["export", str(tmp_path / "empty.jsonl")]) == 2
    assert "no operations" in capsys.readouterr().err


def test_export_to_stdout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ops = object_history(random.Random(1), "kv", ops=6, keys=("a",))
    src = tmp_path / "h.jsonl"
    write_history(ops, src)
    assert history_main(["export", str(src)]) == 0
    text = capsys.readouterr().out
    assert len(text.splitlines()) == len(ops)
    reader = edn_history._OpReader("stdout", "kv", keyed=False)
    assert [reader.op(n, m) for n, m in edn_history.iter_op_maps(text, "stdout")] == ops


# ---------------------------------------------------------------- Hypothesis round trips

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(json_values)
def test_any_json_value_survives_edn(value: JSON) -> None:
    assert edn.to_json(edn.loads(edn.dumps(value))) == value


keys = st.none() | st.integers(min_value=0, max_value=2**63)
processes = st.integers(min_value=0, max_value=10**6) | st.just("nemesis")
types: st.SearchStrategy[OpType] = st.sampled_from(["invoke", "ok", "fail", "info"])


@st.composite
def model_ops(draw: st.DrawFn) -> tuple[str, bool, list[Op]]:
    """Ops of one model with any value of that model's shape."""
    model = draw(st.sampled_from(["register", "cas-register", "kv", "ledger"]))
    keyed = model == "ledger" or (model != "kv" and draw(st.booleans()))
    n = draw(st.integers(min_value=1, max_value=6))
    ops, t = [], 0
    for i in range(n):
        process = draw(processes)
        typ = draw(types)
        t += draw(st.integers(min_value=0, max_value=10**12))
        f = draw(
            st.sampled_from(
                ["read", "write", "cas", "get", "put", "add", "read_lac", "kill-bookie"]
            )
        )
        if process != "nemesis" and model == "kv":
            value: JSON = draw(
                st.none()
                | st.fixed_dictionaries({"key": st.text() | st.integers(), "value": json_values})
            )
            ledger = draw(keys)
        elif process != "nemesis" and model != "ledger" and not keyed:
            value, ledger = draw(json_values), None
        else:
            value, ledger = draw(json_values), draw(keys)
        if typ in ("fail", "info") and draw(st.booleans()):
            value = {"error": draw(st.sampled_from(["fenced", "timed out", "x/y"]))}
        ops.append(Op(i, t, process, typ, f, ledger, value))
    return model, keyed, ops


@settings(max_examples=200)
@given(model_ops())
def test_ops_of_every_model_survive_export_and_read(case: tuple[str, bool, list[Op]]) -> None:
    model, keyed, ops = case
    buf = io.StringIO()
    edn_history.write_edn(ops, buf, model, keyed=keyed)
    reader = edn_history._OpReader("h.edn", model, keyed)
    back = [reader.op(line, m) for line, m in edn_history.iter_op_maps(buf.getvalue(), "h.edn")]
    assert back == ops
