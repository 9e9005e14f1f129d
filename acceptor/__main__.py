import sys

from acceptor.cli import main

sys.exit(main())
