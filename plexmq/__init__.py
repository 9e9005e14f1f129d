"""plexmq, and what every one of its processes shares: the MQTT codec (`mqtt`), the records of the
worker-router link (`wire`), the topic trie and its grants, process and file helpers, the archive's
segment format.

The broker's parts live in folders of their own at the top of the source tree (acceptor/, workers/,
router/, bench/, pipeline/); the links plexmq/acceptor ... name them as this package's subpackages,
so every import says `plexmq.router ...`, from a checkout and installed alike, and site-packages gets
one package, never seven generic names.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("plexmq")
except PackageNotFoundError:  # run from a source tree that was never installed
    VERSION = "0.1.0"
