"""A mypy plugin that teaches mypy the package-dir mapping in pyproject.toml.

The broker's folders (acceptor/, workers/, router/, bench/, pipeline/) are installed as
plexmq.acceptor ... (`[tool.setuptools.package-dir]`), and from a checkout plexmq/__init__.py appends
the checkout root to its `__path__`. Mypy finds modules by their path alone (`plexmq/router/core.py`)
and has no setting for such a mapping, so this plugin answers its module lookups for the mapped
packages from the folders themselves, and makes `plexmq` depend on every module in them so that plain
`mypy` checks them all, each under its installed name (the names the code imports).

Only used by mypy (pyproject's `[tool.mypy] plugins`); it reads the mapping from pyproject.toml, so a
package added there needs nothing here.
"""

from __future__ import annotations

import gc
import os
import tomllib
from pathlib import Path

from mypy.modulefinder import FindModuleCache
from mypy.nodes import MypyFile
from mypy.plugin import Plugin, ReportConfigContext

ROOT = Path(__file__).resolve().parent.parent
_package_dir: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
MAPPED = {name: ROOT / folder for name, folder in _package_dir.items()}


def mapped_path(module: str) -> Path | None:
    """The file in the checkout that is `module`, if it lies in a mapped package."""
    for package, folder in MAPPED.items():
        if module == package or module.startswith(package + "."):
            base = folder.joinpath(*module[len(package):].split(".")[1:])
            for candidate in (base / "__init__.py", base.with_suffix(".py")):
                if candidate.is_file():
                    return candidate
    return None


def submodules(module: str) -> list[str]:
    """The modules and subpackages directly inside the mapped package `module`."""
    path = mapped_path(module)
    if path is None or path.name != "__init__.py":
        return []
    found = []
    for entry in sorted(path.parent.iterdir()):
        if entry.suffix == ".py" and entry.name != "__init__.py":
            found.append(f"{module}.{entry.stem}")
        elif (entry / "__init__.py").is_file():
            found.append(f"{module}.{entry.name}")
    return found


def mapped_modules() -> dict[str, str]:
    """Every module in the mapped packages, by its installed name, with its file."""
    found: dict[str, str] = {}
    for package, folder in MAPPED.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = os.fspath(path)
    return found


def teach(cache: FindModuleCache) -> None:
    """Put the mapped modules in mypy's lookup cache, where its own search never looks again."""
    cache.results.update(mapped_modules())


class PackageDirPlugin(Plugin):
    taught = False

    def teach_once(self) -> None:
        # mypy is compiled (its finder cannot be patched) and gives a plugin no handle on its module
        # finder: the one finder of this run is found among the live objects. The two hooks below run
        # for the first file given to mypy, parsed or read from the cache, before any import of it is
        # looked up.
        if not self.taught:
            for cache in (o for o in gc.get_objects() if isinstance(o, FindModuleCache)):
                teach(cache)
            self.taught = True

    def report_config_data(self, ctx: ReportConfigContext) -> None:
        self.teach_once()

    def get_additional_deps(self, file: MypyFile) -> list[tuple[int, str, int]]:
        self.teach_once()
        if file.fullname == "plexmq":
            return [(10, package, -1) for package in MAPPED]
        return [(10, module, -1) for module in submodules(file.fullname)]


def plugin(version: str) -> type[Plugin]:
    return PackageDirPlugin
