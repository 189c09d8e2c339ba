"""Bad input to any `bkref` command: one line on stderr naming the problem, exit 2.

Exit status 1 means "anomalies found", so a crash that exits 1 is a false alarm
in CI. Every command that reads a file or takes numbers is run here in a
process of its own (as a user runs it) on a table of bad inputs: a binary file, a
truncated JSON line, an empty file, wrong JSON types, numbers out of range,
a missing file, a directory where a file is expected, and the like. Each must
exit 2 with a short message that names the file or the argument, without a
traceback and without falling through to the dispatcher's "internal error"
(the last line of defence, for bugs; these cases must be worded on purpose).

Nothing is started: campaign, cluster, zookeeper, bookie, shell and spark-check
must reject these before they start a process, connect to ZooKeeper or start
Spark. Each case is a child forked from one process that imported bkref's commands
(tests/unit/forked_cli.py): an interpreter per case cost 47 CPU s per `make verify`,
nearly all of it starting Python and importing. One case in eight also runs as
`python -m bkref.impl.cli.main ...`, and must end the same way.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from bkref.linearizability.history import Op
from bkref.linearizability.history_files import write_jsonl, write_parquet

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Case:
    """``argv``, ``said`` and ``absent`` may use ``{d}``, the directory of the bad
    files, and ``{id}``, the case's id (an output path of its own)."""

    id: str
    argv: tuple[str, ...]
    said: str  # a part of the one message line
    absent: str | None = None  # a path that must not exist afterwards (nothing was started)


def case(id: str, argv: str, said: str, absent: str | None = None) -> Case:
    return Case(id, tuple(argv.split()), said, absent)


VALID = "{d}/valid.jsonl"
OWN = "{d}/{id}"  # an output path of the case's own, that must not be created
ZK = "--zk 127.0.0.1:1 --zk-timeout 1"  # nothing listens there: a case that connects fails

CASES = [
    # ---------------------------------------------------------------- check
    case("check-binary", "check {d}/binary.jsonl", "binary.jsonl line 1: not UTF-8 text"),
    case("check-truncated", "check {d}/truncated.jsonl", "truncated.jsonl line 2: not valid JSON"),
    case("check-empty", "check {d}/empty.jsonl", "empty.jsonl: no operations"),
    case("check-header-only", "check {d}/header.jsonl", "header.jsonl: no operations"),
    case("check-wrong-type", "check {d}/wrongtype.jsonl", "wrongtype.jsonl line 1: index must"),
    case("check-wrong-value", "check {d}/wrongvalue.jsonl", "wrongvalue.jsonl: index 0: entry"),
    case(
        "check-wrong-value-search",
        "check --engine search {d}/wrongvalue.jsonl",
        "wrongvalue.jsonl: index 0: entry",
    ),
    case("check-not-an-object", "check {d}/array.jsonl", "array.jsonl line 1: expected a JSON"),
    case("check-type-a-list", "check {d}/typelist.jsonl", "typelist.jsonl line 1: unknown type"),
    case("check-binary-parquet", "check {d}/binary.parquet", "binary.parquet: not a readable"),
    case("check-empty-parquet", "check {d}/empty.parquet", "empty.parquet: no operations"),
    case("check-directory", "check {d}/emptydir", "emptydir: no .parquet files"),
    case("check-missing", "check {d}/missing.jsonl", "missing.jsonl: no such file"),
    case("check-second-file-bad", f"check {VALID} {{d}}/binary.jsonl", "binary.jsonl line 1"),
    case("check-jepsen-binary", "check {d}/jepsen.log", "jepsen.log line 2: not UTF-8 text"),
    case("check-edn-binary", "check {d}/kv.edn", "kv.edn line 2: not UTF-8 text"),
    case("check-budget-negative", f"check --budget -5 {VALID}", "argument --budget: expected"),
    case("check-budget-nan", f"check --budget nan {VALID}", "argument --budget: expected"),
    case("check-jobs-0", f"check --jobs 0 {VALID}", "argument --jobs: expected an integer"),
    case("check-html-nowhere", f"check --html {{d}}/no/t.html {VALID}", "--html {d}/no/t.html"),
    # ---------------------------------------------------------------- history
    case("validate-binary", "history validate {d}/binary.jsonl", "binary.jsonl line 1: not UTF-8"),
    case("validate-truncated", "history validate {d}/truncated.jsonl", "truncated.jsonl line 2"),
    case("validate-empty", "history validate {d}/empty.jsonl", "empty.jsonl: no operations"),
    case("validate-wrong-type", "history validate {d}/wrongtype.jsonl", "index must be"),
    case("validate-parquet", "history validate {d}/binary.parquet", "binary.parquet: not a"),
    case("validate-directory", "history validate {d}/emptydir", "emptydir: no .parquet files"),
    case("validate-missing", "history validate {d}/missing.jsonl", "missing.jsonl: cannot read"),
    case(
        "convert-binary",
        "history convert {d}/binary.jsonl {d}/out.parquet",
        "binary.jsonl line 1: not UTF-8",
        absent="{d}/out.parquet",
    ),
    case(
        "convert-empty",
        "history convert {d}/empty.jsonl {d}/out.jsonl",
        "empty.jsonl: no operations",
        absent="{d}/out.jsonl",
    ),
    case(
        "convert-to-directory",
        f"history convert {VALID} {{d}}/emptydir",
        "emptydir: is a directory",
    ),
    case("convert-missing", "history convert {d}/missing.jsonl {d}/o.jsonl", "missing.jsonl"),
    # ---------------------------------------------------------------- gen-history
    case("gen-ops-0", "gen-history --ops 0 --out {d}/g.jsonl", "argument --ops: expected"),
    case("gen-ops-negative", "gen-history --ops -1 --out {d}/g.jsonl", "argument --ops"),
    case("gen-ledgers-0", "gen-history --ops 9 --ledgers 0 --out {d}/g.jsonl", "--ledgers"),
    case("gen-out-directory", "gen-history --ops 9 --out {d}/emptydir", "--out {d}/emptydir"),
    case("gen-out-nowhere", "gen-history --ops 9 --out {d}/no/g.jsonl", "--out {d}/no/g.jsonl"),
    # ---------------------------------------------------------------- spec
    case("spec-max-states-negative", "spec check --max-states -1 --config x", "--max-states"),
    case("spec-max-states-0", "spec check --max-states 0 --config x", "--max-states: expected"),
    case("spec-workers-0", "spec check --workers 0 --config x", "argument --workers"),
    case("spec-walk-0", "spec check --walk 0 --config x", "argument --walk: expected"),
    case("spec-unknown-config", "spec check --config nonesuch", "unknown config 'nonesuch'"),
    # ---------------------------------------------------------------- refine
    case("refine-no-config", "refine --config nope", "no config 'nope'"),
    case("refine-plant", "refine --plant nope", "unknown planted bug(s) ['nope']"),
    case("refine-examples", "refine --examples 0", "argument --examples"),
    case("refine-plant-spec", "refine --driver spec --plant ack-before-fsync", "needs --driver"),
    # ---------------------------------------------------------------- campaign
    *(
        case(f"campaign{arg.replace(' ', '')}", f"campaign {arg} --out {OWN}", said, OWN)
        for arg, said in [
            ("--time 0", "argument --time: expected a number > 0"),
            ("--time -1", "argument --time"),
            ("--time nan", "argument --time"),
            ("--bookies 0", "argument --bookies: expected an integer >= 3"),
            ("--bookies 2", "argument --bookies"),
            ("--runs 0", "argument --runs"),
            ("--writers 0", "argument --writers"),
            ("--readers -1", "argument --readers"),
            ("--in-flight 0", "argument --in-flight"),
            ("--entries-per-ledger 0", "argument --entries-per-ledger"),
            ("--seed -1", "argument --seed"),
            ("--quorum 3,2", "--quorum wants E,Wq,Aq"),
            ("--quorum 2,3,2", "need E >= Wq >= Aq >= 1"),
            ("--quorum 5,3,2 --bookies 3", "the ensemble is larger than --bookies 3"),
            ("--fault-length 1,inf", "--fault-length needs finite seconds"),
            ("--fault-length x", "--fault-length wants MIN,MAX"),
            ("--faults meteor", "unknown fault kind(s) ['meteor']"),
        ]
    ),
    case("campaign-out-file", "campaign --out {d}/binary.jsonl", "--out {d}/binary.jsonl"),
    # ---------------------------------------------------------------- cluster
    *(
        case(f"cluster-{name}", f"cluster up {arg} --dir {OWN}", said, OWN)
        for name, arg, said in [
            ("bookies-0", "--bookies 0", "argument --bookies: expected an integer >= 1"),
            ("timeout-0", "--timeout 0", "argument --timeout: expected a number > 0"),
            ("set-not-toml", "--set x=[1", "--set 'x=[1': not a TOML key and value"),
            ("set-no-value", "--set gcWaitTime", "expected KEY=VALUE"),
            ("set-unknown", "--set foo=1", "--set 'foo=1': unknown parameter(s) foo"),
            ("set-wrong-type", '--set bookiePort="x"', "bookiePort must be an integer"),
        ]
    ),
    case("cluster-dir-is-a-file", "cluster up --dir {d}/binary.jsonl", "not a directory"),
    case("cluster-status-nothing", "cluster status --dir {d}/emptydir", "no cluster was started"),
    case("cluster-status-binary", "cluster status --dir {d}/badstate", "cluster.json: not UTF-8"),
    case("cluster-down-not-json", "cluster down --dir {d}/badjson", "cluster.json: not JSON"),
    case("cluster-status-shape", "cluster status --dir {d}/badshape", "cluster.json: not a"),
    # ---------------------------------------------------------------- zookeeper
    case("zk-size-0", f"zookeeper start --size 0 --dir {OWN}", "argument --size", OWN),
    case("zk-timeout-negative", f"zookeeper start --timeout -1 --dir {OWN}", "--timeout", OWN),
    case("zk-dir-is-a-file", "zookeeper start --dir {d}/binary.jsonl", "not a directory"),
    case("zk-status-nothing", "zookeeper status --dir {d}/emptydir", "no ZooKeeper was started"),
    case("zk-status-binary", "zookeeper status --dir {d}/badstate", "zookeeper.json: not UTF-8"),
    case("zk-stop-not-json", "zookeeper stop --dir {d}/badjson", "zookeeper.json: not JSON"),
    # ---------------------------------------------------------------- bookie, autorecovery
    *(
        case(f"{cmd}-{name}", f"{cmd} --config {{d}}/{file}", said)
        for cmd in ("bookie", "autorecovery")
        for name, file, said in [
            ("binary", "binary.jsonl", "binary.jsonl: not UTF-8 text; expected TOML"),
            ("empty", "empty.toml", "empty.toml: no parameters"),
            ("truncated", "truncated.toml", "truncated.toml: not valid TOML"),
            ("wrong-type", "wrongtype.toml", "bookiePort must be an integer, got 'x'"),
            ("negative", "negative.toml", "gcWaitTime must not be negative"),
            ("directory", "emptydir", "emptydir: Is a directory"),
            ("missing", "missing.toml", "missing.toml: No such file"),
        ]
    ),
    case("bookie-log-level", "bookie --config {d}/good.toml --log-level LOUD", "--log-level"),
    case("bookie-dump-to-dir", "bookie --config {d}/good.toml --dump {d}/emptydir", "--dump"),
    # ---------------------------------------------------------------- shell
    case("shell-zk-timeout-0", "shell listbookies --zk 127.0.0.1:1 --zk-timeout 0", "--zk-timeout"),
    case("shell-ledger-negative", f"shell ledgermetadata -5 {ZK}", "argument ledger: expected"),
    case("shell-first-negative", f"shell readledger 1 --first -1 {ZK}", "argument --first"),
    case("shell-quorums", f"shell simpletest -e 2 -w 3 {ZK}", "needs E >= Wq >= Aq"),
    case("shell-entries-negative", f"shell simpletest -n -1 {ZK}", "argument --entries"),
    case("shell-percentage", f"shell checkledgers --percentage 101 {ZK}", "from 0 to 100"),
    case("shell-delay-missing", f"shell lostbookierecoverydelay set {ZK}", "needs SECONDS"),
    case("shell-delay-negative", f"shell lostbookierecoverydelay set -4 {ZK}", "argument seconds"),
    case("shell-decommission", f"shell decommission b --timeout 0 {ZK}", "argument --timeout"),
    case("shell-status-ledger", f"shell status --ledger -1 {ZK}", "argument --ledger"),
    # ---------------------------------------------------------------- docker
    case("docker-dir-is-a-file", "docker engine start --dir {d}/binary.jsonl", "not a directory"),
    case("docker-build-dir-file", "docker build --dir {d}/binary.jsonl", "not a directory"),
    # ---------------------------------------------------------------- spark-check (no Spark)
    *(
        case(f"spark-{name}", f"spark-check {path} --out {OWN}", said, OWN)
        for name, path, said in [
            ("binary", "{d}/binary.jsonl", "binary.jsonl line 1: not UTF-8 text"),
            # The first line only: the rest is read as it is converted, with Spark up.
            ("truncated", "{d}/truncated1.jsonl", "truncated1.jsonl line 1: not valid JSON"),
            ("empty", "{d}/empty.jsonl", "empty.jsonl: no operations"),
            ("header-only", "{d}/header.jsonl", "header.jsonl: no operations"),
            ("wrong-type", "{d}/wrongtype.jsonl", "wrongtype.jsonl line 1: index must"),
            ("binary-parquet", "{d}/binary.parquet", "binary.parquet: not a readable Parquet"),
            ("empty-parquet", "{d}/empty.parquet", "empty.parquet: no operations"),
            ("empty-dir", "{d}/emptydir", "emptydir: no .parquet or .jsonl history"),
            ("missing", "{d}/missing.jsonl", "missing.jsonl: no such file"),
            ("budget-0", f"{VALID} --budget 0", "argument --budget"),
            ("partitions-0", f"{VALID} --partitions 0", "argument --partitions"),
            ("dumps-missing", f"{VALID} --dumps {{d}}/missing", "--dumps {d}/missing"),
            ("dumps-empty", f"{VALID} --dumps {{d}}/emptydir", "no entries.jsonl"),
        ]
    ),
    case("spark-out-file", f"spark-check {VALID} --out {{d}}/binary.jsonl", "not a directory"),
]


def _write_files(d: Path) -> None:
    rng = random.Random(17)
    junk = bytes([0xB3]) + rng.randbytes(400)  # starts with a byte UTF-8 cannot begin with
    add = {"entry": 0, "data": "a"}
    valid = [Op(0, 0, 1, "invoke", "add", 1, add), Op(1, 1, 1, "ok", "add", 1, add)]
    write_jsonl(valid, d / "valid.jsonl")
    good_line = (d / "valid.jsonl").read_text().splitlines()[1]
    (d / "binary.jsonl").write_bytes(junk)
    (d / "binary.parquet").write_bytes(junk)
    (d / "truncated.jsonl").write_text(good_line + '\n{"index": 1, "time": 1, "proc')
    (d / "truncated1.jsonl").write_text('{"index": 0, "time": 0, "proc')
    (d / "empty.jsonl").write_bytes(b"")
    write_jsonl([], d / "header.jsonl")
    write_parquet([], d / "empty.parquet")
    op = '"time": 0, "process": 1, "type": "invoke", "f": "add", "ledger": 1'
    (d / "wrongtype.jsonl").write_text(f'{{"index": "x", {op}, "value": null}}\n')
    wrong_value = '{"entry": "x", "data": 5}'
    (d / "wrongvalue.jsonl").write_text(
        f'{{"index": 0, {op}, "value": {wrong_value}}}\n'
        + f'{{"index": 1, {op.replace("invoke", "ok")}, "value": {wrong_value}}}\n'
    )
    (d / "array.jsonl").write_text("[1, 2]\n")
    typelist = op.replace('"type": "invoke"', '"type": ["ok"]')
    (d / "typelist.jsonl").write_text(f'{{"index": 0, {typelist}, "value": null}}\n')
    (d / "jepsen.log").write_bytes(b"INFO  jepsen.util - 1 :invoke :read nil\n\xff\xfe\n")
    (d / "kv.edn").write_bytes(b'{:process 1, :type :invoke, :f :get, :key "a"}\n\xff\n')
    (d / "emptydir").mkdir()
    (d / "empty.toml").write_bytes(b"")
    (d / "truncated.toml").write_text('bookiePort = 3999\nzkServers = "127.0.0.1:')
    (d / "wrongtype.toml").write_text('bookiePort = "x"\n')
    (d / "negative.toml").write_text("gcWaitTime = -1\n")
    (d / "good.toml").write_text(
        f'bookiePort = 3999\njournalDirectory = "{d}/j"\nledgerDirectories = ["{d}/l"]\n'
        'zkServers = "127.0.0.1:1"\n'
    )
    for name, content in [("badstate", junk), ("badjson", b'{"size": 1'), ("badshape", b"[]")]:
        (d / name).mkdir()
        (d / name / "cluster.json").write_bytes(content)
        (d / name / "zookeeper.json").write_bytes(content)


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "BKREF_TRACEBACK"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _argv(c: Case, d: Path) -> list[str]:
    return [a.format(d=d, id=c.id) for a in c.argv]


def _python(args: list[str], timeout: float, stdin: str | None = None) -> Ran:
    done = subprocess.run(
        [sys.executable, *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=_env(),
        timeout=timeout,
        check=False,
    )
    return Ran(done.returncode, done.stdout, done.stderr)


def _run(c: Case, d: Path) -> Ran:
    """``c`` as a user runs it: an interpreter of its own."""
    return _python(["-m", "bkref.impl.cli.main", *_argv(c, d)], timeout=120)


def _run_forked(cases: list[Case], d: Path) -> dict[str, Ran]:
    """Every case in a process of its own, each forked from one that imported bkref."""
    request = json.dumps({"cases": {c.id: _argv(c, d) for c in cases}})
    done = _python(["-m", "tests.unit.forked_cli"], timeout=300, stdin=request)
    assert done.returncode == 0, done.stderr
    return {k: Ran(*v) for k, v in json.loads(done.stdout).items()}


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("bad-input")
    _write_files(d)
    return d


@pytest.fixture(scope="module")
def results(bad_files: Path) -> dict[str, Ran]:
    """Every case's run, each forked from one process (tests/unit/forked_cli.py)."""
    return _run_forked(CASES, bad_files)


# One case in eight, from every part of the table, also as an interpreter of its own.
ALONE = [c for i, c in enumerate(CASES) if i % 8 == 0]


def test_a_forked_case_ends_as_the_same_command_run_alone(
    bad_files: Path, results: dict[str, Ran]
) -> None:
    with ThreadPoolExecutor(max_workers=4) as pool:
        ran = pool.map(lambda c: _run(c, bad_files), ALONE)
        alone = dict(zip([c.id for c in ALONE], ran, strict=True))
    assert len(alone) >= 10
    assert {k: results[k] for k in alone} == alone


def _message_lines(stderr: str) -> list[str]:
    """stderr without argparse's usage block (its first line and the indented rest)."""
    return [
        line
        for line in stderr.splitlines()
        if line.strip() and not line.startswith("usage:") and not line[0].isspace()
    ]


def test_the_case_ids_are_unique() -> None:
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_naming_the_problem_and_exit_2(
    c: Case, bad_files: Path, results: dict[str, Ran]
) -> None:
    out = results[c.id]
    where = f"bkref {' '.join(c.argv)}".format(d=bad_files, id=c.id)
    assert out.returncode == 2, f"{where}: exit {out.returncode}\n{out.stderr}"
    assert "Traceback" not in out.stderr, where
    assert "internal error" not in out.stderr, f"{where}: not worded\n{out.stderr}"
    lines = _message_lines(out.stderr)
    assert len(lines) == 1, f"{where}: one message line expected\n{out.stderr}"
    assert c.said.format(d=bad_files, id=c.id) in lines[0], f"{where}\n{out.stderr}"
    assert lines[0].startswith("bkref ")
    assert len(out.stderr) < 2500, where
    assert "[1/" not in out.stderr, f"{where}: Spark started"
    if c.absent is not None:
        absent = Path(c.absent.format(d=bad_files, id=c.id))
        assert not absent.exists(), f"{where}: something started"


def test_the_two_copies_of_the_argument_types_are_equal() -> None:
    # bkref/spec/cli_args.py serves spec, linearizability and spark_checks; bkref/impl/cli/args.py
    # serves impl and nemesis: no one package may be imported by all of them.
    spec_copy = (ROOT / "bkref" / "spec" / "cli_args.py").read_bytes()
    impl_copy = (ROOT / "bkref" / "impl" / "cli" / "args.py").read_bytes()
    assert spec_copy == impl_copy


def test_allow_empty_accepts_an_empty_history_and_help_says_so(
    bad_files: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bkref.linearizability import check_cli, cli

    for path in (bad_files / "empty.jsonl", bad_files / "header.jsonl"):
        assert check_cli.main(["--allow-empty", str(path)]) == 0
        assert cli.history_main(["validate", "--allow-empty", str(path)]) == 0
    assert "valid, 0 ops" in capsys.readouterr().out
    for parser in (check_cli._parser(), cli._parser()):
        text = " ".join(parser.format_help().split())
        assert "no operations" in text
        assert "--allow-empty" in text
