"""python -m channels_nats: tools for people who run the layer (see `check --help`)."""

from __future__ import annotations

import sys

from ._check import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
