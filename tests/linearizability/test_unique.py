"""The unique-writes engine: the same verdicts as the search, proofs that name the anomaly."""

from __future__ import annotations

import csv
import json
import math
import random
import re
from pathlib import Path

import pytest

from bkref.linearizability import unique, wgl
from bkref.linearizability.check_cli import main
from bkref.linearizability.generate import Event, to_ops
from bkref.linearizability.history import JSON, Op, Operation, OpType, pair
from bkref.linearizability.history_files import write_history
from bkref.linearizability.models import MODELS
from bkref.linearizability.peer import read_edn_kv, read_jepsen_log
from bkref.linearizability.registers import MODELS as GENERATED
from bkref.linearizability.registers import PLANTS, plant, register_history

PEER = Path(__file__).resolve().parents[1] / "data" / "peer-histories"


def _ops(*events: tuple[int, OpType, str, JSON]) -> list[Operation]:
    """(process, type, f, value) in real-time order; one register (ledger None)."""
    return pair(Op(i, i, p, t, f, None, v) for i, (p, t, f, v) in enumerate(events))


def _invalid(model: str, ops: list[Operation]) -> wgl.PartitionResult:
    r = unique.check(model, ops)
    assert r.verdict == "invalid"
    (part,) = r.invalid
    assert part.blocked in part.proof
    return part


def _proof_ops(part: wgl.PartitionResult) -> set[int]:
    """The proof as history indices of invocations."""
    return {part.calls[i].call for i in part.proof}


def _assert_linearization(model: str, part: wgl.PartitionResult) -> None:
    """A valid key's linearization holds every op with a known outcome, replays
    through the model, and keeps real-time order."""
    m = MODELS[model]
    lin = part.linearization
    assert len(set(lin)) == len(lin)
    known = {i for i, c in enumerate(part.calls) if c.ret != math.inf}
    assert known <= set(lin)
    (state,) = m.init(())
    for i in lin:
        after = m.step(state, part.calls[i].input)
        assert after, f"{m.describe(part.calls[i].input)} cannot follow {state!r}"
        (state,) = after
    latest = -math.inf  # the latest invocation placed so far
    for i in lin:  # no op completed before one placed ahead of it was invoked
        assert part.calls[i].ret > latest
        latest = max(latest, part.calls[i].call)


def _mutated(rng: random.Random, events: list[Event], model: str) -> list[Event]:
    """A read told another value, or two neighbouring events of two processes swapped."""
    out = list(events)
    values: list[JSON] = [None if model != "kv" else ""]
    for _, _, f, _, v in out:
        x = v["value"] if isinstance(v, dict) else v
        if f in ("write", "put") and x not in values:
            values.append(x)
        if f == "cas" and isinstance(x, list):
            values.append(x[1])
    for _ in range(rng.randint(1, 3)):
        reads = [i for i, e in enumerate(out) if e[1] == "ok" and e[2] in ("read", "get")]
        if reads and rng.random() < 0.5:
            i = rng.choice(reads)
            p, t, f, led, v = out[i]
            new = rng.choice(values)
            out[i] = (p, t, f, led, {"key": v["key"], "value": new} if isinstance(v, dict) else new)
        elif len(out) > 1:
            i = rng.randrange(len(out) - 1)
            if out[i][0] != out[i + 1][0]:
                out[i], out[i + 1] = out[i + 1], out[i]
    return out


def _case(seed: int) -> tuple[str, list[Operation], str]:
    rng = random.Random(seed)
    model = rng.choice(GENERATED)
    keys = rng.choice((1, 1, 2))
    events = register_history(
        rng, rng.randint(1, 12), rng.randint(1, 5), keys, model, crash=rng.choice((0, 0.2, 0.5))
    )
    how = rng.choice(("valid", "planted", "mutated", "mutated"))
    if how == "planted":
        planted = plant(rng, events, rng.choice(PLANTS), model, keys)
        if planted is not None:
            events = planted[0]
    elif how == "mutated":
        events = _mutated(rng, events, model)
    return model, pair(to_ops(events)), how


def test_the_engine_and_the_search_agree_on_small_histories() -> None:
    counts = {"valid": 0, "invalid": 0, "unknown": 0}
    for seed in range(3000):
        model, ops, how = _case(seed)
        searched = wgl.check(model, ops, jobs=1)
        decided = unique.check(model, ops)  # generated writes are unique, mutated or not
        assert decided.verdict == searched.verdict, (seed, model, how)
        counts[decided.verdict] += 1
        for part in decided.partitions:
            if part.verdict == "valid":
                _assert_linearization(model, part)
    # Both verdicts are well represented, so agreement means something.
    assert counts["valid"] > 800
    assert counts["invalid"] > 800


def test_the_array_witness_holds_exactly_when_the_key_is_linearizable() -> None:
    """For keys without cas the engine first guesses an order in a few array passes
    (``_witness``). The guess must hold whenever the full decision finds the key
    linearizable (else valid keys would take the slow path), and never otherwise."""
    counts = {"found": 0, "none": 0}
    cases = [_case(seed)[:2] for seed in range(3000)]
    for seed in range(300):  # longer histories: many chains to merge
        rng = random.Random(seed)
        model = rng.choice(("register", "kv"))
        events = register_history(rng, 150, rng.randint(2, 12), 1, model, crash=0.1)
        if seed % 2:
            events = _mutated(rng, events, model)
        cases.append((model, pair(to_ops(events))))
    for model, ops in cases:
        m = MODELS[model]
        init = unique._initial(m)
        for key, calls in wgl.partition(m, ops).items():
            if any(c.input[0] == "cas" for c in calls):
                continue
            producers = unique._values(key, calls, init)
            guess = unique._witness(calls, producers)
            try:
                order: list[int] | None = unique._Decision(m, calls, init, producers).run()
            except unique._InvalidError:
                order = None
            assert (guess is None) == (order is None), (model, calls)
            if guess is not None and order is not None:
                counts["found"] += 1
                for lin in (guess, order):
                    _assert_linearization(
                        model, wgl.PartitionResult(key, "valid", tuple(calls), tuple(lin))
                    )
            else:
                counts["none"] += 1
    assert counts["found"] > 1000
    assert counts["none"] > 600


@pytest.mark.parametrize(
    ("kind", "model"),
    # A lost cas needs a model with cas.
    [(k, m) for k in PLANTS for m in GENERATED if k != "lost-cas" or m == "cas-register"],
)
def test_a_planted_anomaly_is_found_and_its_proof_names_it(kind: str, model: str) -> None:
    found = 0
    for seed in range(40):
        rng = random.Random(seed)
        keys = rng.choice((1, 3))
        events = register_history(rng, rng.randint(5, 200), 4, keys, model)
        planted = plant(rng, events, kind, model, keys)
        if planted is None:
            continue
        bad, where = planted
        r = unique.check(model, pair(to_ops(bad)))
        assert r.verdict == "invalid", seed
        assert any(_proof_ops(part) & set(where) for part in r.invalid), seed
        found += 1
    assert found >= 20


def test_valid_histories_of_every_model_replay_their_linearization() -> None:
    for model in GENERATED:
        rng = random.Random(11)
        ops = pair(to_ops(register_history(rng, 3000, 20, 3, model, crash=0.05)))
        r = unique.check(model, ops)
        assert r.verdict == "valid"
        assert len(r.partitions) == 3
        for part in r.partitions:
            _assert_linearization(model, part)


# ---------------------------------------------------------------- invalid at once


def test_a_read_of_a_value_no_one_wrote() -> None:
    part = _invalid(
        "register",
        _ops(
            (0, "invoke", "write", 1),
            (0, "ok", "write", 1),
            (1, "invoke", "read", None),
            (1, "ok", "read", 2),
        ),
    )
    assert _proof_ops(part) == {2}
    assert "observed 2, which no operation wrote" in part.reason


def test_a_cas_from_a_value_no_one_wrote() -> None:
    part = _invalid("cas-register", _ops((0, "invoke", "cas", [7, 8]), (0, "ok", "cas", [7, 8])))
    assert _proof_ops(part) == {0}


def test_two_successful_cas_from_one_value() -> None:
    part = _invalid(
        "cas-register",
        _ops(
            (0, "invoke", "cas", [None, 1]),
            (1, "invoke", "cas", [None, 2]),
            (0, "ok", "cas", [None, 1]),
            (1, "ok", "cas", [None, 2]),
        ),
    )
    assert _proof_ops(part) == {0, 1}
    assert "only one can follow it" in part.reason


def test_a_cycle_of_cas_that_no_write_leads_to() -> None:
    part = _invalid(
        "cas-register",
        _ops(
            (0, "invoke", "cas", [1, 2]),
            (1, "invoke", "cas", [2, 1]),
            (0, "ok", "cas", [1, 2]),
            (1, "ok", "cas", [2, 1]),
        ),
    )
    assert _proof_ops(part) == {0, 1}
    assert "a cycle of cas" in part.reason


def test_a_read_that_completed_before_its_write_was_invoked() -> None:
    part = _invalid(
        "register",
        _ops(
            (1, "invoke", "read", None),
            (1, "ok", "read", 1),
            (0, "invoke", "write", 1),
            (0, "ok", "write", 1),
        ),
    )
    assert _proof_ops(part) == {0, 2}


def test_a_read_of_the_initial_value_after_a_write_completed() -> None:
    part = _invalid(
        "kv",
        pair(
            to_ops(
                [
                    (0, "invoke", "put", None, {"key": "k", "value": "a"}),
                    (0, "ok", "put", None, {"key": "k", "value": "a"}),
                    (1, "invoke", "get", None, {"key": "k", "value": None}),
                    (1, "ok", "get", None, {"key": "k", "value": None}),  # "" to the model
                ]
            )
        ),
    )
    assert _proof_ops(part) == {0, 2}
    assert "still saw ''" in part.reason


def test_two_writes_seen_in_opposite_orders_is_a_two_cycle() -> None:
    part = _invalid(
        "register",
        _ops(
            (0, "invoke", "write", 1),
            (1, "invoke", "write", 2),
            (0, "ok", "write", 1),
            (1, "ok", "write", 2),
            (2, "invoke", "read", None),
            (2, "ok", "read", 1),
            (3, "invoke", "read", None),
            (3, "ok", "read", 2),
            (2, "invoke", "read", None),
            (2, "ok", "read", 2),
            (3, "invoke", "read", None),
            (3, "ok", "read", 1),
        ),
    )
    # 1 must be in place before write(1) completed, but the read at 8 still saw 2;
    # and 2 before write(2) completed, but the read at 10 still saw 1.
    assert part.reason.count("must be in place before") == 2
    assert _proof_ops(part) == {0, 1, 8, 10}


# ---------------------------------------------------------------- unknown outcomes


def test_an_unobserved_write_of_unknown_outcome_constrains_nothing() -> None:
    h = _ops(
        (0, "invoke", "write", 1),
        (0, "info", "write", 1),
        (1, "invoke", "read", None),
        (1, "ok", "read", None),
    )
    r = unique.check("register", h)
    assert r.verdict == "valid"
    assert r.partitions[0].linearization == (1,)  # the write left out


def test_an_observed_cas_of_unknown_outcome_happened() -> None:
    chain: list[tuple[int, OpType, str, JSON]] = [
        (0, "invoke", "write", 1),
        (0, "ok", "write", 1),
        (1, "invoke", "cas", [1, 2]),
        (1, "info", "cas", [1, 2]),
    ]
    seen = _ops(*chain, (2, "invoke", "read", None), (2, "ok", "read", 2))
    assert unique.check("cas-register", seen).verdict == "valid"
    # It took 1, so a read of 1 invoked after 2 was read must fail.
    late = _ops(
        *chain,
        (2, "invoke", "read", None),
        (2, "ok", "read", 2),
        (3, "invoke", "read", None),
        (3, "ok", "read", 1),
    )
    assert unique.check("cas-register", late).verdict == "invalid"
    assert wgl.check("cas-register", late).verdict == "invalid"


# ---------------------------------------------------------------- where it does not apply


@pytest.mark.parametrize(
    ("model", "events", "why"),
    [
        (
            "register",
            [(0, "write", 3), (1, "write", 3)],
            "key None: value 3 is written twice (op 0 and op 2): --engine unique needs "
            "unique writes",
        ),
        (
            "cas-register",
            [(0, "write", None)],
            "key None: op 0 writes the initial value None: --engine unique needs unique writes",
        ),
        (
            "kv",
            [(0, "append", {"key": "a", "value": "x"})],
            "key 'a': op 0 is 'append': --engine unique decides reads, writes and cas only",
        ),
    ],
)
def test_it_does_not_apply_and_says_why(
    model: str, events: list[tuple[int, str, JSON]], why: str
) -> None:
    ops = _ops(*[(p, t, f, v) for p, f, v in events for t in ("invoke", "ok")])
    assert unique.applies(model, ops) == why
    with pytest.raises(unique.NotApplicable, match=f"^{re.escape(why)}$"):
        unique.check(model, ops)


def test_it_does_not_apply_to_ledgers() -> None:
    assert unique.applies("ledger", []) == (
        "--engine unique checks the register, cas-register and kv models, not ledger"
    )


# ---------------------------------------------------------------- the command line


def _file(tmp_path: Path, events: list[Event], name: str = "h.jsonl") -> Path:
    path = tmp_path / name
    write_history(to_ops(events), path)
    return path


def _report(capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    (report,) = json.loads(capsys.readouterr().out)["files"]
    assert isinstance(report, dict)
    return report


def test_auto_picks_unique_for_unique_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(4)
    events = register_history(rng, 400, 10, 2, "kv")
    assert main([str(_file(tmp_path, events)), "--model", "kv", "--json"]) == 0
    assert _report(capsys)["engine"] == "unique"
    bad, where = plant(rng, events, "stale-read", "kv", 2) or ([], [])
    html = tmp_path / "t.html"
    path = _file(tmp_path, bad, "bad.jsonl")
    assert main([str(path), "--model", "kv", "--json", "--html", str(html)]) == 1
    report = _report(capsys)
    assert report["engine"] == "unique"
    parts = report["partitions"]
    assert isinstance(parts, list)
    (part,) = [p for p in parts if p["verdict"] == "invalid"]
    assert set(where) <= set(part["proof_ops"])
    assert "must be in place before" in part["reason"]
    page = html.read_text()
    for op in part["proof_ops"]:
        assert re.search(rf'class="op \w+ hot"[^>]*data-d="\[{op}\] ', page), op
    assert main([str(path), "--model", "kv"]) == 1
    out = capsys.readouterr().out
    assert "nonlinearizable: key 'k" in out
    assert f"(ops {part['proof_ops']})" in out


def test_engine_unique_on_repeated_writes_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = PEER / "jepsen" / "etcd_000.log"
    assert main([str(path), "--engine", "unique"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith(f"bkref check: {path}: key None: value ")
    assert line.endswith("is written twice (op 4 and op 10): --engine unique needs unique writes")
    assert main([str(_ledger_file(tmp_path)), "--engine", "unique"]) == 2
    assert "checks the register, cas-register and kv models, not ledger" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main([str(path), "--engine", "unique", "--model", "ledger"])
    assert exit_.value.code == 2


def _ledger_file(tmp_path: Path) -> Path:
    path = tmp_path / "ledger.jsonl"
    path.write_text(
        '{"index": 0, "time": 0, "process": 0, "type": "invoke", "f": "create", "ledger": null}\n'
    )
    return path


def test_auto_falls_back_to_the_search_with_its_verdicts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Histories that repeat a value: auto gives the search's verdict, said to be the search's."""
    checked = 0
    for seed in range(60):
        rng = random.Random(seed)
        events = register_history(rng, 10, 3, 1, "register")
        # Write some value a second time: the engine no longer applies.
        writes = [i for i, e in enumerate(events) if e[1:3] == ("invoke", "write")]
        if len(writes) < 2:
            continue
        first = events[writes[0]][4]
        i = writes[-1]
        p, _, f, led, _ = events[i]
        events[i] = (p, "invoke", f, led, first)
        for j in range(i + 1, len(events)):
            if events[j][0] == p:
                events[j] = (p, events[j][1], f, led, first)
                break
        events = _mutated(rng, events, "register")
        ops = pair(to_ops(events))
        if unique.applies("register", ops) is None:
            continue
        expected = wgl.check("register", ops, jobs=1).verdict
        code = main([str(_file(tmp_path, events)), "--model", "register", "--json"])
        report = _report(capsys)
        assert report["engine"] == "search"
        assert report["verdict"] == expected
        assert code == {"valid": 0, "invalid": 1}[expected]
        checked += 1
    assert checked >= 30


def _repeat_a_write(events: list[Event], key: str) -> list[Event]:
    """The last put of ``key`` writes what its first put wrote (invocation and completion)."""
    puts = [i for i, e in enumerate(events) if e[1:3] == ("invoke", "put") and e[4]["key"] == key]
    out = list(events)
    if len(puts) < 2:
        return out
    value = {"key": key, "value": events[puts[0]][4]["value"]}
    p, _, f, led, _ = out[puts[-1]]
    out[puts[-1]] = (p, "invoke", f, led, value)
    for j in range(puts[-1] + 1, len(out)):
        if out[j][0] == p:
            out[j] = (p, out[j][1], f, led, value)
            break
    return out


def test_auto_searches_only_the_keys_whose_writes_repeat(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One key repeats a value, the other does not: auto decides the second without
    search and searches the first, and the verdict is the search's on the whole history."""
    verdicts = {"valid": 0, "invalid": 0}
    for seed in range(40):
        rng = random.Random(seed)
        events = _repeat_a_write(register_history(rng, 60, 4, 2, "kv"), "k0")
        if seed % 2:
            events = _mutated(rng, events, "kv")
        ops = pair(to_ops(events))
        if {p.key for p in unique.check("kv", ops, search_others=True).partitions} != {"k0", "k1"}:
            continue
        with pytest.raises(unique.NotApplicable, match=r"^key 'k0': value "):
            unique.check("kv", ops)
        expected = wgl.check("kv", ops, jobs=1).verdict
        code = main([str(_file(tmp_path, events)), "--model", "kv", "--json", "--jobs", "1"])
        report = _report(capsys)
        assert report["engine"] == "unique+search"
        parts = report["partitions"]
        assert isinstance(parts, list)
        assert {p["key"]: p["engine"] for p in parts} == {"k0": "search", "k1": "unique"}
        assert report["verdict"] == expected
        assert code == {"valid": 0, "invalid": 1}[expected]
        verdicts[expected] += 1
    assert verdicts["valid"] >= 5
    assert verdicts["invalid"] >= 5


def _peer() -> list[tuple[str, bool]]:
    with open(PEER / "verdicts.tsv", encoding="utf-8") as f:
        return [(name, flag == "true") for name, flag in list(csv.reader(f, delimiter="\t"))[1:]]


def test_the_peer_suite_falls_back_to_the_search(capsys: pytest.CaptureFixture[str]) -> None:
    """Jepsen's etcd logs repeat small values and the kv histories append: none is for
    the engine, so auto searches every one (whose verdicts test_peer_histories holds)."""
    peer = _peer()
    for name, _ in peer:
        if name.startswith("jepsen/"):
            ops, model = pair(read_jepsen_log(PEER / name)), "cas-register"
        else:
            ops, model = pair(read_edn_kv(PEER / name)), "kv"
        assert unique.applies(model, ops) is not None, name
    for name, linearizable in peer:
        if "c50" in name:  # the slow ones are the search's own test
            continue
        assert main([str(PEER / name), "--json", "--jobs", "1"]) == (0 if linearizable else 1)
        assert _report(capsys)["engine"] == "search"
