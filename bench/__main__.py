"""`python -m bench ...` is `plexmq bench ...`."""

import sys

from bench.cli import main

sys.exit(main())
