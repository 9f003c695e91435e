import sys

from inferpool.cli import main

sys.exit(main())
