"""A writer in its own process (so a test can SIGKILL it): prints each acknowledged entry.

``python -m tests.impl.writer_proc ZK PASSWORD ENTRIES``: creates a ledger (E=3,
Wq=3, Aq=2), prints ``created <id>``, then adds with 16 in flight and prints
``acked <entry>`` for each completion, flushing every line.
"""

from __future__ import annotations

import asyncio
import sys

from bkref.impl.client.client import BookKeeper


async def _main(zk: str, password: bytes, entries: int) -> None:
    async with BookKeeper(zk) as bk:
        h = await bk.create_ledger(3, 3, 2, password)
        print(f"created {h.ledger_id}", flush=True)
        sem = asyncio.Semaphore(16)

        async def one(i: int) -> None:
            async with sem:
                e = await h.add(b"entry-%d" % i)
                print(f"acked {e}", flush=True)

        await asyncio.gather(*(one(i) for i in range(entries)))
        await asyncio.sleep(3600)  # never close: the test kills us


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1], sys.argv[2].encode(), int(sys.argv[3])))
