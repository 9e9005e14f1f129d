"""What the jobs need besides plexmq, checked before Spark starts: a line for each missing part saying
how to get it, instead of an ImportError's traceback or Spark's `JAVA_GATEWAY_EXITED` after its own
error lines."""

from __future__ import annotations

import importlib
import os
import re
import shutil
from pathlib import Path

# The Python packages of `plexmq[pipeline]`, by module, and how they are called.
PACKAGES = {"pyspark": "PySpark", "pyarrow": "PyArrow", "pandas": "pandas", "matplotlib": "Matplotlib"}
INSTALL = "pip install 'plexmq[pipeline]'"
JAVA = 17  # the oldest Java that Spark 4 runs on
GET_JAVA = f"install Java {JAVA} or newer (Debian, Ubuntu: apt install openjdk-{JAVA}-jre-headless)"


def missing() -> list[str]:
    """A line for each prerequisite that is missing or unusable; none when all are there."""
    lines = []
    for module, name in PACKAGES.items():
        try:
            importlib.import_module(module)
        except ImportError as e:
            lines.append(f"{name} cannot be imported ({e}): {INSTALL}")
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # else spark-submit runs us, in its own Java
        lines += _java()
    return lines


def _java() -> list[str]:
    """What is wrong with the Java that Spark would run, as spark-submit finds it: $JAVA_HOME/bin/java,
    else `java` on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        java = Path(home) / "bin" / "java"
        if not os.access(java, os.X_OK):
            return [f"JAVA_HOME is {home}, which has no bin/java: set it to a Java {JAVA} (or newer) "
                    f"installation, or unset it to use java from PATH; or {GET_JAVA}"]
    else:
        found = shutil.which("java")
        if found is None:
            return [f"no Java: JAVA_HOME is not set and there is no java on PATH: {GET_JAVA}"]
        java = Path(found)
    version = _version(java.resolve().parent.parent)
    if version is not None and version < JAVA:
        return [f"{java} is Java {version}; Spark needs {JAVA} or newer: {GET_JAVA}, and set JAVA_HOME to it"]
    return []


def _version(home: Path) -> int | None:
    """The major version of the Java installed at `home`, from its `release` file; None when unknown."""
    try:
        text = (home / "release").read_text()
    except OSError:
        return None
    found = re.search(r'^JAVA_VERSION="(?:1\.)?(\d+)', text, re.MULTILINE)
    return int(found.group(1)) if found else None
