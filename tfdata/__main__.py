"""``python -m tfdata``: the command line (see :mod:`tfdata.cli`)."""

import sys

from .cli import main

sys.exit(main())
