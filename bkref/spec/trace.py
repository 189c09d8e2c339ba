"""Readable traces: each step's action and the variables it changed, as text or JSON."""

from __future__ import annotations

import json
from typing import Any

from bkref.spec.checker import TraceStep
from bkref.spec.protocol import (
    RC_NAMES,
    RD_NAMES,
    STATUS_NAMES,
    UP_NAMES,
    W_NAMES,
    Recovery,
    Segments,
    State,
    show_message,
)


def _bookies(mask: int) -> str:
    return "{" + ",".join(f"b{i}" for i in range(mask.bit_length()) if mask >> i & 1) + "}"


def _ledgers(mask: int) -> str:
    return "{" + ",".join(f"L{i}" for i in range(mask.bit_length()) if mask >> i & 1) + "}"


def _entries(mask: int) -> str:
    return "{" + ",".join(f"e{i}" for i in range(mask.bit_length()) if mask >> i & 1) + "}"


def _segments(segs: Segments) -> str:
    return (
        "["
        + ", ".join(f"{f}:" + "(" + ",".join(f"b{b}" for b in ens) + ")" for f, ens in segs)
        + "]"
    )


def describe(s: State) -> dict[str, str]:
    """Every variable of ``s`` as a short human-readable string."""
    out: dict[str, str] = {}
    for ledger, status in enumerate(s.meta_status):
        p = f"meta[L{ledger}]."
        out[p + "status"] = STATUS_NAMES[status]
        out[p + "segments"] = _segments(s.meta_segments[ledger])
        out[p + "last"] = str(s.meta_last[ledger])
        out[p + "version"] = str(s.meta_version[ledger])
        version, lost = s.meta_task[ledger]
        out[p + "task"] = f"v{version} lost {_bookies(lost)}" if lost else "none"
        out[p + "lock"] = f"worker {s.meta_lock[ledger]}" if s.meta_lock[ledger] >= 0 else "free"
    out["meta.autorecovery"] = "enabled" if s.meta_autorecovery else "disabled"
    out["meta.auditor"] = f"epoch {s.meta_auditor[0]} node {s.meta_auditor[1]}"
    for b, per in enumerate(s.b_ledgers):
        out[f"b{b}.up"] = UP_NAMES[s.b_up[b]]
        for ledger, (synced, unsynced, fenced, lac) in enumerate(per):
            text = f"entries {_entries(synced)}"
            if unsynced:
                text += f" unsynced {_entries(unsynced)}"
            text += f" lac {lac}" + (" fenced" if fenced else "")
            if ledger == len(per) - 1 and any(x >= -1 for x in s.b_signed[b]):
                text += " signed " + ",".join(
                    f"e{e}:{x}" for e, x in enumerate(s.b_signed[b]) if x >= -1
                )
            out[f"b{b}[L{ledger}]"] = text
    out["writer.status"] = W_NAMES[s.w_status]
    out["writer.segments"] = _segments(s.w_segments)
    out["writer.change"] = "none" if s.w_change is None else _segments(s.w_change)
    out["writer.next"] = str(s.w_next)
    out["writer.lac"] = str(s.w_lac)
    out["writer.acks"] = " ".join(f"e{e}:{_bookies(a)}" for e, a in enumerate(s.w_acks))
    for c, r in enumerate(map(Recovery._make, s.rc)):
        p = "recovery." if c == 0 else f"recovery{c}."  # client 0 unnumbered, as in labels
        out[p + "phase"] = RC_NAMES[r.phase] + (" (requested)" if s.rc_requested else "")
        out[p + "segments"] = _segments(r.segments)
        out[p + "read_segments"] = _segments(r.read_segments)
        out[p + "fenced"] = _bookies(r.fenced) + f" max lac {r.max_lac}"
        out[p + "reading"] = f"e{r.reading} negatives {_bookies(r.negative)}"
        out[p + "last"] = str(r.last)
        out[p + "lac"] = str(r.lac)
        out[p + "acks"] = " ".join(f"e{e}:{_bookies(a)}" for e, a in enumerate(r.acks) if a)
    for i, (handle, lac, polling, returned) in enumerate(s.rd):
        out[f"reader{i}"] = (
            f"{RD_NAMES[handle]} lac {lac}"
            + (" (LAC read in flight)" if polling else "")
            + f" returned {_entries(returned)}"
        )
    for w, (bookie, ledger, tv, pending) in enumerate(s.wk):
        seen = s.wk_seen[w]
        out[f"worker{w}"] = f"on b{bookie}, " + (
            f"L{ledger} task v{tv} {_pending(pending)}"
            + (f" saw lost {_bookies(seen)}" if seen else "")
            + (" (its lock lost)" if s.wk_unlocked >> w & 1 else "")
            if ledger >= 0
            else "idle"
        )
    out["auditor"] = (
        " ".join(f"node{n}:epoch {e}" for n, e in enumerate(s.au_leads))
        + (" stale" if s.au_stale else "")
        + (f" missed {_ledgers(s.au_missed)}" if s.au_missed else "")
        + (f" back {_bookies(s.au_back)}" if s.au_back else "")
    )
    for m in sorted(set(s.msgs)):
        out["msg " + show_message(m)] = f"x{s.msgs.count(m)}"
    out["budget"] = str(s.budget)
    return out


def _pending(p: tuple[int, int, int] | None) -> str:
    if p is None:
        return "nothing under way"
    if p[1] < 0:
        return "verified" if p[0] == -1 else "recovering"
    return f"copied segment {p[0]} of b{p[1]} at version {p[2]}"


def diff(before: State, after: State) -> list[str]:
    """``variable: old -> new`` for every variable the step changed."""
    a, b = describe(before), describe(after)
    out = [
        f"{k}: {a.get(k, '-')} -> {v}" for k, v in b.items() if a.get(k) != v and k[:4] != "msg "
    ]
    out += [f"sent: {k[4:]}" for k in b if k[:4] == "msg " and k not in a]
    out += [f"gone: {k[4:]}" for k in a if k[:4] == "msg " and k not in b]
    return out


def format_trace(trace: list[TraceStep]) -> str:
    """The trace as numbered actions, each followed by the variables it changed."""
    lines = []
    for i, step in enumerate(trace):
        lines.append(f"{i:3d}. {step.action}")
        if i == 0:
            continue
        lines += [f"       {d}" for d in diff(trace[i - 1].state, step.state)]
    return "\n".join(lines)


def trace_json(trace: list[TraceStep]) -> list[dict[str, Any]]:
    """The trace as JSON-ready records: action, changed variables, full state."""
    out = []
    for i, step in enumerate(trace):
        out.append(
            {
                "step": i,
                "action": step.action,
                "changed": diff(trace[i - 1].state, step.state) if i else [],
                "state": describe(step.state),
            }
        )
    return out


def dumps(obj: object) -> str:
    return json.dumps(obj, indent=2)
