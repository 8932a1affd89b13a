"""Tasks come from the entry-point group `streamrl.tasks` (streamrl.tasks.plugins): streamrl's own, and a
package's, read from installed metadata (a real .dist-info folder on sys.path here)."""

from __future__ import annotations

import sys

import pytest

from streamrl.tasks import TASKS, plugins
from streamrl.tasks.plugins import TaskRegistry


def install(site, dist: str, entries: dict[str, str]):
    """A minimal installed distribution: its metadata and entry points, as pip writes them."""
    info = site / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[streamrl.tasks]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()))


@pytest.fixture
def site(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins.entry_points.cache_clear()
    yield tmp_path
    plugins.entry_points.cache_clear()
    sys.modules.pop("my_tasks", None)


def test_the_built_in_tasks_come_from_streamrls_own_entry_points():
    for name, where in [("copy", "streamrl.tasks.symbols:Copy"), ("dataset", "streamrl.tasks.dataset:DatasetTask"),
                        ("math", "streamrl.tasks.math_answer:MathAnswer")]:
        assert TASKS.origin(name).startswith(f"{where} (entry point, streamrl ")
    assert TASKS.get("copy").__name__ == "Copy"


def test_an_installed_package_adds_a_task_loaded_only_when_used(site):
    (site / "my_tasks.py").write_text("class Mine:\n    pass\n")
    install(site, "my-tasks", {"mine": "my_tasks:Mine"})
    reg = TaskRegistry("task")
    assert "mine" in reg and "mine" in reg.names() and "copy" in reg.names()
    assert "my_tasks" not in sys.modules  # listed from metadata, not imported
    assert reg.origin("mine") == "my_tasks:Mine (entry point, my-tasks 1.0)"
    assert reg.get("mine").__name__ == "Mine"


def test_two_packages_claiming_one_name_is_an_error_naming_both(site):
    install(site, "pkg-a", {"twin": "a_mod:Twin"})
    install(site, "pkg-b", {"twin": "b_mod:Twin"})
    twice = r"'twin' is declared twice.*a_mod:Twin \(pkg-a 1.0\).*b_mod:Twin \(pkg-b 1.0\)"
    with pytest.raises(ValueError, match=twice):
        TaskRegistry("task").names()


def test_a_broken_plug_in_names_itself(site):
    install(site, "broken", {"broken": "no_such_module_xyz:Task"})
    with pytest.raises(ValueError, match=r"'broken': cannot load entry point no_such_module_xyz:Task \(broken 1.0\)"):
        TaskRegistry("task").get("broken")


def test_an_in_process_registration_may_not_shadow_an_installed_task():
    reg = TaskRegistry("task")

    class Copy:
        pass

    with pytest.raises(ValueError, match="already installed as an entry point"):
        reg.register("copy")(Copy)
    reg.register("scratch")(Copy)
    assert reg.get("scratch") is Copy and "registered in this process only" in reg.origin("scratch")
