"""plexmq, and what every one of its processes shares: the MQTT codec (`mqtt`), the records of the
worker-router link (`wire`), the topic trie and its grants, process and file helpers, the archive's
segment format.

The broker's parts live in folders of their own at the top of the source tree (acceptor/, workers/,
router/, bench/, pipeline/) and are installed under this package (`plexmq.router` ...: pyproject's
package-dir), so that they never collide with other packages of those generic names. Run from a
checkout (the tests, a worktree, Spark's Python workers), those folders are found beside this one.
"""

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

try:
    VERSION = version("plexmq")
except PackageNotFoundError:  # run from a source tree that was never installed
    VERSION = "0.1.0"

_checkout = Path(__file__).resolve().parent.parent
if (_checkout / "pyproject.toml").is_file() and (_checkout / "router" / "__init__.py").is_file():
    __path__.append(str(_checkout))
