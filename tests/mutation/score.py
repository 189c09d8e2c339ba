"""The mutation score of a session, with its interval, and the survivors' verdicts.

A sampled mutant that ran is one of:

- **killed**: its test failed (the spec: a verdict of `make spec-check` changed, see
  ``spec_kill``; the core: a test or the refinement machine failed);
- **timeout**: cosmic-ray stopped it after the target's timeout (cosmic-ray records
  that as killed), or a test passed pytest-timeout's limit (``spec_kill``'s verdict
  ``timeout``). Never a kill, since nothing said the mutant was wrong: it counts as a
  survivor does, against the score until a verdict judges it (leaving it out would
  assume the checks kill the slow mutants as often as the rest);
- **survived**: every test passed. A survivor counts for the score only when
  ``verdicts.toml`` judges it *equivalent* (it cannot change a behaviour, and says
  why), *killed-by-config* (a config added since it ran fails with it: the verdict
  names the config, and tests/unit/test_mutation_verdicts.py applies the mutant's diff and runs
  that config again) or *killed-by-test* (a test added since fails with it: the verdict
  names the test, which tests/unit/test_mutation_verdicts.py runs on the mutated spec). Any other
  verdict (*needs-config*, *finding*, or none yet) leaves
  it against the score until a new config or test kills it or the fix lands;
- **incompetent**: the mutated module did not even import (cosmic-ray's own
  outcome), or is not Python at all (``mark_syntax_errors``); counted apart, like
  timeouts;
- **error**: the test could not judge the mutant (the core's refinement run could
  not start its ZooKeeper, say: exit 2, not a difference); counted apart, and run
  again by a fresh session.

The score is (killed + equivalent + killed-by-config + killed-by-test) / (killed +
survived + timeout), with a
95% Wilson score interval for the sampled proportion: the sample is uniform over the
population the operator filter leaves, so the interval is the population's.
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VERDICTS = Path(__file__).with_name("verdicts.toml")
KINDS = ("equivalent", "killed-by-config", "killed-by-test", "needs-config", "finding")
# Survivors the score counts for the checks: a kill since is checked by test_mutation_verdicts.
CREDITED = ("equivalent", "killed-by-config", "killed-by-test")
# Outcomes that are no kill and still count for the score, each until its verdict.
UNKILLED = ("survived", "timeout")


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95% for z = 1.96)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    centre = p + z * z / (2 * n)
    margin = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    denominator = 1 + z * z / n
    return (max(0.0, (centre - margin) / denominator), min(1.0, (centre + margin) / denominator))


def mutant_key(r: dict[str, Any], source: str) -> str:
    """Names a mutant across edits elsewhere in its file: its function, its operator, the
    text of its line and the line as mutated (line numbers and occurrences move with
    every edit; one line may hold several mutants of one operator, as NumberReplacer's
    two of each number)."""
    lines = source.splitlines()
    text = lines[r["line"] - 1].strip() if 0 < r["line"] <= len(lines) else ""
    removed, added = diff_lines(str(r.get("diff", "")))
    if len(removed) == 1 and removed[0].strip() != text:
        # The file moved since the run (an edit above the line): the line as it was.
        text = removed[0].strip()
    after = " / ".join(ln.strip() for ln in added)
    return f"{r['module']}:{r['definition']}:{r['operator']}:{text} => {after}"


def diff_lines(diff: str) -> tuple[list[str], list[str]]:
    """A unified diff's removed and added lines, without their '-' and '+'."""
    rows = diff.splitlines()
    removed = [ln[1:] for ln in rows if ln.startswith("-") and not ln.startswith("---")]
    added = [ln[1:] for ln in rows if ln.startswith("+") and not ln.startswith("+++")]
    return removed, added


def load_verdicts(path: Path = VERDICTS) -> dict[str, dict[str, str]]:
    """``[[mutant]]`` tables: key, verdict (one of KINDS) and reason."""
    if not path.exists():
        return {}
    out: dict[str, dict[str, str]] = {}
    for m in tomllib.loads(path.read_text()).get("mutant", []):
        if m.get("verdict") not in KINDS or not m.get("reason"):
            raise SystemExit(f"{path}: {m.get('key')}: needs a verdict of {KINDS} and a reason")
        if (m["verdict"] == "killed-by-config") != bool(m.get("config")):
            raise SystemExit(f"{path}: {m.get('key')}: a config, with killed-by-config only")
        if (m["verdict"] == "killed-by-test") != bool(m.get("test")):
            raise SystemExit(
                f"{path}: {m.get('key')}: a test (a pytest node id), with killed-by-test only"
            )
        if m["key"] in out:
            # The later table would win in silence, whatever the earlier one says.
            raise SystemExit(f"{path}: {m['key']}: judged twice; keep one verdict")
        out[m["key"]] = m
    return out


def outcome(r: dict[str, Any]) -> str:
    if r.get("syntax_error"):  # set by ``mark_syntax_errors``
        return "incompetent"
    verdict = last_json(r["output"]).get("verdict")
    if r["output"].strip() == "timeout" or verdict == "timeout":
        return "timeout"
    if verdict == "error":
        return "error"
    if r["test"] == "incompetent" or r["worker"] == "exception":
        return "incompetent"
    return "killed" if r["test"] == "killed" else "survived"


def compiles(r: dict[str, Any], source: str) -> bool:
    """Whether the mutant (of ``source``, its module as it was) is Python at all: cosmic-ray's
    parso-based operators can take a keyword-only ``*`` for a product and make ``-,``."""
    from cosmic_ray.mutating import mutate_code
    from cosmic_ray.plugins import get_operator

    code = mutate_code(source, get_operator(r["operator"])(), r["occurrence"])
    if code is None:
        return True
    try:
        compile(code, r["module"], "exec")
    except SyntaxError:
        return False
    return True


def mark_syntax_errors(results: list[dict[str, Any]], sources: dict[str, str]) -> None:
    """Flag as incompetent the mutants whose module does not compile. Only those whose test
    could have met the error are compiled again (mutating re-parses the whole module): a
    pytest that could not even load its conftest (exit 4), or a spec that raised."""
    for r in results:
        if "pytest exit 4" in r["output"] or "SyntaxError" in r["output"]:
            r["syntax_error"] = not compiles(r, sources[r["module"]])


def last_json(output: str) -> dict[str, Any]:
    """The kill script's verdict line (the last JSON object of its output), if any."""
    for line in reversed(output.strip().splitlines()):
        if line.startswith("{"):
            try:
                data: dict[str, Any] = json.loads(line)
                return data
            except json.JSONDecodeError:
                break
    return {}


@dataclass
class Score:
    target: str
    results: list[dict[str, Any]]
    keys: dict[str, str]  # job -> mutant key
    verdicts: dict[str, dict[str, str]]
    counts: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for r in self.results:
            o = outcome(r)
            self.counts[o] = self.counts.get(o, 0) + 1

    @property
    def survivors(self) -> list[dict[str, Any]]:
        """The mutants no check killed, each to be judged: survived or timed out."""
        return [r for r in self.results if outcome(r) in UNKILLED]

    def verdict(self, r: dict[str, Any]) -> dict[str, str]:
        return self.verdicts.get(self.keys[r["job"]], {})

    def judged_as(self, *kinds: str) -> int:
        """Survivors whose verdict is one of ``kinds``."""
        return sum(1 for r in self.survivors if self.verdict(r).get("verdict") in kinds)

    @property
    def equivalent(self) -> int:
        return self.judged_as("equivalent")

    @property
    def killed_later(self) -> int:
        """Survivors a config or a test added since they ran kills."""
        return self.judged_as("killed-by-config", "killed-by-test")

    @property
    def judged(self) -> int:
        """Mutants that count for the score: killed, survived or timed out."""
        return self.counts.get("killed", 0) + len(self.survivors)

    @property
    def credited(self) -> int:
        """Mutants the score counts for the checks: killed, judged equivalent, or killed
        by a config or a test added since."""
        return self.counts.get("killed", 0) + self.judged_as(*CREDITED)

    @property
    def score(self) -> float:
        return self.credited / self.judged if self.judged else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(self.credited, self.judged)
