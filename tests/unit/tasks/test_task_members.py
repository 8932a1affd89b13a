"""Every task member is in the `Task` protocol or `TaskDefaults` (optional ones with their defaults), and nothing asks
a task whether it has one: `optional` reads each, once."""

from __future__ import annotations

import re
from pathlib import Path

from streamrl.tasks.base import Task, TaskDefaults, optional

ROOT = Path(__file__).resolve().parents[3]
NAMED = {"row_converter", "sample_report", "agent_fn", "grouped", "submit_groups", "collect_groups", "train"}
"""Members that code once probed tasks for with hasattr / getattr (issue 45)."""
MEMBERS = sorted({*vars(TaskDefaults), *vars(Task), *NAMED} - set(vars(object)) - {"__module__", "__dict__", "__doc__",
                                                                                   "__weakref__", "__annotations__"})


def test_no_code_probes_a_task_for_a_member():
    # close: environments, clients and pools have one too (an environment's is probed: its protocol leaves it out)
    names = "|".join(re.escape(m) for m in MEMBERS if not m.startswith("_") and m != "close")
    probe = re.compile(rf"""(hasattr|getattr)\([^()]*,\s*["']({names})["']|["']({names})["'] in dir\(""")
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
             for folder in ("streamrl", "actors", "learner") for p in sorted((ROOT / folder).rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if probe.search(line)]
    assert found == []


def test_a_plug_in_without_the_optional_members_reads_their_defaults():
    class Bare:  # the Task protocol's members only
        pass

    assert optional(Bare, "row_converter") is None and optional(Bare, "sample_report") is None
    assert optional(Bare(), "agent_fn") is None
    assert optional(Bare(), "environment_class")() is None


def test_the_protocol_names_every_optional_member():
    optional_members = [m for m in vars(TaskDefaults) if not m.startswith("_")]
    assert all(m in Task.__doc__ for m in optional_members), optional_members
