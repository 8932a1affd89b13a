"""The README is the front page (issue 30): it fits a screen or two, and the test command it shows is the one
.ci/run runs verbatim; its links point at pages that exist."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
README = REPO / "README.md"


def test_readme_stays_within_12_kb():
    size = README.stat().st_size
    assert size <= 12 * 1024, f"README.md is {size} bytes; move detail to a page under docs/ (limit 12 KB)"


def test_readme_shows_the_test_command_that_ci_runs_verbatim():
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    marker = ci.index("# The README's test command, verbatim:")
    command = ci[marker + 1]
    assert "pytest" in command
    assert command in README.read_text().splitlines()
    # the README's first command (install, then the tiny run) comes before it, as a new user runs them
    first = ci.index("# The README's install and tiny run, verbatim:")
    assert first < marker and ci[first + 1].endswith("&& streamrl run") and ci[first + 1] in README.read_text()


def test_readme_links_to_files_that_exist():
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    local = [t for t in targets if not re.match(r"[a-z]+://", t)]
    assert local, "the README links to the docs"
    missing = [t for t in local if not (REPO / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"
