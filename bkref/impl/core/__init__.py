"""The sans-I/O core: pure protocol logic that takes messages and ticks and returns actions.

Nothing here imports asyncio, kazoo or the file system: the shells (bookie
server, storage, client) move bytes and persist records; the core decides.
"""
