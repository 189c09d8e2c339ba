"""The impl benchmark's ceiling (tests/bench/fanout.py) is an add: durable on two of three."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from tests.bench import fanout


def test_an_add_waits_for_two_fsynced_answers_and_not_for_the_third(tmp_path: Path) -> None:
    with fanout.servers(tmp_path, "asyncio") as procs:

        async def go() -> None:
            add, close = await fanout.connect([port for port, _ in procs], 1024)
            try:
                await asyncio.wait_for(add(), 10)
                # One server frozen: two answers still make the add.
                os.kill(procs[2][1], signal.SIGSTOP)
                await asyncio.wait_for(add(), 10)
                # Two frozen: one answer is not enough.
                os.kill(procs[1][1], signal.SIGSTOP)
                pending = asyncio.ensure_future(add())
                await asyncio.sleep(0.5)
                assert not pending.done()
                os.kill(procs[1][1], signal.SIGCONT)
                await asyncio.wait_for(pending, 10)
                os.kill(procs[2][1], signal.SIGCONT)
            finally:
                close()

        asyncio.run(go())
        sizes = [(tmp_path / f"fanout-{i}").stat().st_size for i in range(2)]
    # The two that answered all three adds wrote all three before answering.
    assert sizes[0] == 3 * 1024
    assert sizes[1] == 3 * 1024
