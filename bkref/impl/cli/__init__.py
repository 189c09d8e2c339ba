"""The `bkref` command line: a dispatcher and the impl-side subcommands."""
