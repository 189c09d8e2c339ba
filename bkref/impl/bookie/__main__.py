"""`python -m bkref.impl.bookie --config FILE`: the same as `bkref bookie`."""

import sys

from bkref.impl.bookie.main import main

sys.exit(main(sys.argv[1:]))
