#!/usr/bin/env python
"""Train, distil, evaluate and export the bundled demo models (models/demo-target, models/demo-draft).

    python scripts/train_demo_models.py all --resume      # the whole pipeline; rerun to continue after a stop
    python scripts/train_demo_models.py {tokenizer,target,draft,export,eval,measure} [options]

Recipe, durations and results: models/README.md. The stages live in scripts/demo_training/.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from demo_training.cli import main

if __name__ == "__main__":
    sys.exit(main())
