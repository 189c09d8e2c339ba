"""Ensemble placement: choose bookies so that no failure domain holds two of one ensemble."""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping


class NotEnoughBookiesError(RuntimeError):
    """There are not enough writable bookies in distinct failure domains."""


def choose_ensemble(
    candidates: Mapping[str, str],
    size: int,
    *,
    exclude: Collection[str] = (),
    rng: random.Random | None = None,
) -> tuple[str, ...]:
    """``size`` bookies from ``candidates`` (bookie id -> failure domain), one per domain."""
    rng = rng or random.Random()
    pool = [b for b in candidates if b not in exclude]
    rng.shuffle(pool)
    chosen: list[str] = []
    domains: set[str] = set()
    for b in pool:
        if candidates[b] not in domains:
            chosen.append(b)
            domains.add(candidates[b])
        if len(chosen) == size:
            return tuple(chosen)
    raise NotEnoughBookiesError(
        f"need {size} writable bookies in distinct failure domains, found {len(chosen)} "
        f"(available: {len(pool)}, domains: {len({candidates[b] for b in pool})}); "
        "start more bookies or lower the ensemble size"
    )


def replace_bookie(
    ensemble: tuple[str, ...],
    failed: str,
    candidates: Mapping[str, str],
    *,
    exclude: Collection[str] = (),
    rng: random.Random | None = None,
) -> tuple[str, ...]:
    """``ensemble`` with ``failed`` swapped for a bookie of a domain the others do not use."""
    rng = rng or random.Random()
    keep = [b for b in ensemble if b != failed]
    used = {candidates.get(b, f"?{b}") for b in keep}
    pool = [
        b
        for b in candidates
        if b not in ensemble and b not in exclude and candidates[b] not in used
    ]
    if not pool:
        raise NotEnoughBookiesError(
            f"no bookie can replace {failed}: every writable bookie is already in the "
            "ensemble, excluded, or in a failure domain the ensemble uses"
        )
    new = rng.choice(pool)
    return tuple(new if b == failed else b for b in ensemble)
