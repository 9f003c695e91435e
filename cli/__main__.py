"""``python -m inferpool``: the command line."""

import sys

from inferpool.entry_point import main

sys.exit(main())
