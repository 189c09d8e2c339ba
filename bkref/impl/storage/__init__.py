"""Bookie storage on real files with fsync: journal, entry logs, index, LastLogMark, GC."""
