"""``python -m inferpool``: the command line."""

import sys

from inferpool.cli import main

sys.exit(main())
