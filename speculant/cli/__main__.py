"""``python -m speculant.cli``: the ``speculant`` command without an installed entry point."""

import sys

from speculant.cli import main

sys.exit(main())
