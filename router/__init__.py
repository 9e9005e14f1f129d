"""The topic router, and the wire every process shares with it."""

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("plexmq")
except PackageNotFoundError:  # run from a source tree that was never installed
    VERSION = "0.1.0"
