"""plexmq, and what every one of its processes shares: the MQTT codec (`mqtt`), the records of the
worker-router link (`wire`), the topic trie and its grants, process and file helpers, the archive's
segment format.

The broker's parts live in folders of their own at the top of the source tree (acceptor/, workers/,
router/, bench/, pipeline/); the links plexmq/acceptor ... name them as this package's subpackages,
so every import says `plexmq.router ...`, from a checkout and installed alike, and site-packages gets
one package, never seven generic names.
"""

from functools import cache


@cache
def version() -> str:
    """The installed distribution's version. Asked for when needed, not at import: looking it up costs
    every process ~17 ms at its start (with --workers 8, a tenth of a restart's CPU before the first CONNACK)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("plexmq")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0.1.0"
