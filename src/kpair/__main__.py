"""``python -m kpair`` is the ``kpair`` command (useful where the console script is not on PATH)."""

import sys

from .cli import main

sys.exit(main())
