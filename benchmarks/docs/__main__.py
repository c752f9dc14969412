"""``python -m benchmarks.docs [--check]`` from the repository root."""

import sys

from .generate import main

sys.exit(main())
