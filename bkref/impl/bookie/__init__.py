"""The bookie process: asyncio TCP server over the core and the storage, registered in ZooKeeper."""
