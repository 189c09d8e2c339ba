"""The ledger client: asyncio shell over the core's writer and recovery state machines."""
