"""Plumbing every pytest session needs, whichever folders it collects.

Here rather than in tests/conftest.py so that ``pytest server/store/sqlite.py`` alone
runs that module's doctests on the installed modules too.
"""

from __future__ import annotations

from pathlib import Path as _Path

import pytest

# ----- doctests (`--doctest-modules` over protocol/, trainer_hooks/, server/) -------------
# pytest imports a collected file by its path: protocol/codec.py becomes "protocol.codec",
# a second copy beside the installed gradwatch.protocol.codec (setuptools maps the
# folders into the gradwatch namespace), with classes of its own that pydantic and
# isinstance tell apart. Naming the installed modules under the path-derived names
# first makes pytest find them in sys.modules, so the doctests run on the very modules
# the tests import.
_DOCTESTED = {"protocol": "gradwatch.protocol", "trainer_hooks": "gradwatch.trainer_hooks",
              "server": "gradwatch.server"}  # fmt: skip


def pytest_sessionstart(session: pytest.Session) -> None:
    import importlib
    import pkgutil
    import sys

    if not session.config.getoption("doctestmodules", False):
        return
    root = session.config.rootpath
    asked = {_Path(a.split("::")[0]).resolve() for a in session.config.args}
    for folder, package_name in _DOCTESTED.items():
        if not any(p == root / folder or (root / folder) in p.parents for p in asked):
            continue  # not collected in this session: spare the imports
        package = importlib.import_module(package_name)
        sys.modules.setdefault(folder, package)
        for info in pkgutil.walk_packages(package.__path__, package_name + "."):
            module = importlib.import_module(info.name)
            sys.modules.setdefault(folder + info.name.removeprefix(package_name), module)
