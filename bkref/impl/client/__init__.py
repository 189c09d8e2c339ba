"""The ledger client: an asyncio shell over the core's writer, recovery and readers.

``client`` (the :class:`BookKeeper` client), ``driver`` (ledger handles and the
driver of the core's machines), ``zkcalls`` (bounded ZooKeeper calls), ``errors``
(what the client raises), ``connection`` (one TCP connection to a bookie).
"""
