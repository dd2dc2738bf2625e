import sys

from sweepkit.cli import main

sys.exit(main())
