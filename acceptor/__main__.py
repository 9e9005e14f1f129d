import sys

from plexmq.acceptor.cli import main

sys.exit(main())
