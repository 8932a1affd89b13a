"""Tasks from installed packages: the entry-point group `streamrl.tasks`, one path for every task.

A package declares `[project.entry-points."streamrl.tasks"] my_task = "my_pkg.module:MyTask"`; streamrl's
own tasks are declared the same way in its pyproject.toml. Entry points are read from installed metadata,
so every process (the actors and learner are fresh interpreters) sees the same tasks without importing
anything first; a task's module is imported only when the task is used (the dataset task's `datasets`
import stays out of the tiny job's start-up). `TASKS.register(name)` still adds a task inside one process
(tests, notebooks), but only entry points reach child processes.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from streamrl import registry

GROUP = "streamrl.tasks"


def entry_points() -> dict[str, metadata.EntryPoint]:
    """name → entry point of every installed task (an error if streamrl's own are missing)."""
    return registry.TASKS._installed()


entry_points.cache_clear = registry.entry_points.cache_clear  # type: ignore[attr-defined]
_dist = registry.dist_of


def TaskRegistry(kind: str = "task") -> registry.Registry:
    """A task registry of its own (tests): the installed entry points plus what is registered in it."""
    return registry.Registry(kind, GROUP, own="streamrl.tasks.")


def resolve(ref: str, setting: str, kind: str = "function", group: str | None = None) -> Any:
    """The object `ref` names: "package.module:name", "path/to/file.py:name" (relative to the working directory),
    or (with `group`) the name of an entry point in that group. setting: the config key that holds `ref`, and
    kind: what it should name, both for the error. Raises ValueError saying what is wrong and what is allowed."""
    module_name, sep, attr = ref.rpartition(":")
    if group is not None and not sep:
        eps = {ep.name: ep for ep in metadata.entry_points(group=group)}
        if ref not in eps:
            raise ValueError(f"{setting}={ref!r}: no entry point {ref!r} in group {group!r} (installed: "
                             f"{', '.join(sorted(eps)) or 'none'}); or give 'package.module:{kind}' or "
                             f"'path/to/file.py:{kind}'")
        try:
            return eps[ref].load()
        except Exception as e:  # a broken plug-in names itself rather than failing deep in a run
            raise ValueError(f"{setting}={ref!r}: cannot load entry point {eps[ref].value} ({_dist(eps[ref])}): "
                             f"{type(e).__name__}: {e}") from e
    if not sep or not module_name or not attr:
        raise ValueError(f"{setting}={ref!r}: give 'package.module:{kind}' or 'path/to/file.py:{kind}'")
    if module_name.endswith(".py"):
        path = Path(module_name).resolve()
        if not path.is_file():
            raise ValueError(f"{setting}={ref!r}: no file {path}")
        name = f"streamrl_plugin_{abs(hash(str(path))):x}"
        module = sys.modules.get(name)
        if str(path.parent) not in sys.path:  # the file imports modules beside it, as it would run as a script
            sys.path.append(str(path.parent))  # last: it never shadows an installed package
        if module is None:
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except Exception as e:
                del sys.modules[name]
                raise ValueError(f"{setting}={ref!r}: importing {path} failed: {type(e).__name__}: {e}") from e
    else:
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise ValueError(f"{setting}={ref!r}: cannot import {module_name!r}: {e}") from e
    found = getattr(module, attr, None)
    if not callable(found):
        raise ValueError(f"{setting}={ref!r}: {module_name} has no {kind} {attr!r}")
    return found
