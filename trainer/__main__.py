"""``python -m trainer`` is ``sweep-train``."""

import sys

from trainer.cli import main

sys.exit(main())
