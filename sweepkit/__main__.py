import sys

from sweepkit.cli import console_main

sys.exit(console_main())
