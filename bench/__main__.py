"""`python -m plexmq.bench ...` is `plexmq bench ...`."""

import sys

from plexmq.bench.cli import main

sys.exit(main())
