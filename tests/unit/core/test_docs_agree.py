"""The docs agree with the code (issue 48): every config key a page writes in backticks (`task.reward_levels`,
`transport.group_port=0`) is a key of the config Structs or of a plug-in's options, every default a page states as
"`key` (default X)", "`key` (N)" or in a table with a default column is the config's, every install line is the
README's (`pip install -e .` / `pip install -e '.[extra]'`, the extra one of pyproject's), and every code block headed
`# examples/<file>` is that file's lines (the tests run the files). What is checked against is generated from the
Structs (streamrl.commands.reference_docs) and read from the files, never copied here."""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib
from pathlib import Path

import pytest

from streamrl import config as config_lib
from streamrl.commands import reference_docs

REPO = Path(__file__).resolve().parents[3]
PAGES = sorted((REPO / "docs").rglob("*.md"))
FILES = (".py", ".md", ".yaml", ".yml", ".json", ".jsonl", ".log", ".txt", ".toml", ".sh", ".sbatch", ".safetensors", ".pt",
         ".key", ".key_secret")
NOT_STREAMRLS = {"task.my_steps": "docs/guides/extend.md: the option an example plug-in of the reader's own adds"}


def config_keys() -> dict[str, tuple[str, set[str]]]:
    """{dotted key: (its type as the reference writes it, the defaults it has)}: the Structs' own fields and every
    streamrl plug-in's options under its section (a key several plug-ins declare may have several defaults)."""
    keys: dict[str, tuple[str, set[str]]] = {}

    def add(rows):
        for key, tp, default, _doc in rows:
            keys.setdefault(key, (tp, set()))[1].add(default)

    for _section, rows in reference_docs.config_rows():
        add(rows)
    for section, selectors in config_lib.PLUGIN_SECTIONS.items():
        for _selector, reg in selectors:
            for name in reg.names():
                if (opts := reg.options(name)) is not None:
                    for _s, rows in reference_docs.config_rows(opts, section + "."):
                        add(rows)
    return keys


KEYS = config_keys()
SECTIONS = sorted({k.split(".")[0] for k in KEYS if "." in k}, key=len, reverse=True)
# A key in a code span, alone or as an assignment: `task.data`, `transport.group_port=0`, `task.name: verifiers`,
# `monitoring.*_port`; not a path (`learner.log`), a module (`streamrl.tasks.graders`) or a call (`model.generate()`).
SPAN = re.compile(r"`(?P<key>(?:%s)\.[A-Za-z_*][\w*]*(?:\.[\w*]+)*)(?P<rest>[^`]*)`" % "|".join(SECTIONS))
# and "`key` (N)": a number in parentheses right after a key is its default (`monitoring.learner_port` (29620))
BARE = re.compile(r"`(?P<key>(?:%s)\.[\w.]+)` \((?P<value>[\d.,]+(?: s)?)[);]" % "|".join(SECTIONS))
DEFAULT = re.compile(r"`(?P<key>(?:%s)\.[\w.]+)`[^`(]{0,40}?\(default (?P<value>[^),;:]+)" % "|".join(SECTIONS))


def known(key: str) -> bool:
    if "*" in key:
        return any(fnmatch.fnmatchcase(k, key) for k in KEYS)
    if key in KEYS or key in NOT_STREAMRLS:
        return True
    # a key inside a mapping-valued field (`task.verifiers_args.symbols`, `task.env_config.x`)
    return any(key.startswith(k + ".") and KEYS[k][0].startswith("dict") for k in KEYS)


def spans(page: Path):
    """(line number, key, what follows it in the span) of every config-key code span on the page."""
    for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        for m in SPAN.finditer(line):
            key, rest = m["key"], m["rest"]
            if key.endswith(FILES) or rest.startswith(("(", "/")) or (rest and rest[0] not in "=: ["):
                continue
            yield n, key, rest


def where(page: Path, n: int) -> str:
    return f"{page.relative_to(REPO)}:{n}"


def test_every_config_key_a_page_names_exists():
    wrong = [f"{where(page, n)}: `{key}` is no config key (nor a plug-in's option); did you mean "
             f"{_nearest(key)}?" for page in PAGES for n, key, _rest in spans(page) if not known(key)]
    assert not wrong, "\n".join(wrong)


def _nearest(key: str) -> str:
    import difflib
    return ", ".join(difflib.get_close_matches(key, list(KEYS), n=3)) or "(nothing close)"


def _same(stated: str, defaults: set[str]) -> bool:
    """Whether a page's stated default is one of the config's (JSON text): `30 s` is 30, `on` is true, `[]` is []."""
    said = stated.strip().strip("`").strip()
    if m := re.fullmatch(r"([\d.,]+) (KiB|MiB|GiB)", said):
        said = str(float(m[1].replace(",", "")) * 1024 ** (1 + ("KiB", "MiB", "GiB").index(m[2])))
    said = re.sub(r"^(\S+) (s|seconds|bytes|tokens|steps)$", r"\1", said)
    said = {"on": "true", "off": "false", "none": "null", "None": "null", "yes": "true", "no": "false"}.get(said, said)
    for d in defaults:
        if said == d or said == d.strip('"'):
            return True
        try:
            if float(said.replace(",", "")) == float(json.loads(d)):
                return True
        except (ValueError, TypeError):
            pass
    return False


def stated_defaults(page: Path):
    """(line number, key, the default the page states) from "`key` (default X" and from tables with a default column."""
    lines = page.read_text(encoding="utf-8").splitlines()
    for n, line in enumerate(lines, 1):
        for m in [*DEFAULT.finditer(line), *BARE.finditer(line)]:
            yield n, m["key"], m["value"]
    header = None
    for n, line in enumerate(lines, 1):
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = [c.lower() for c in cells]
            continue
        if "default" not in header or set(line) <= set("|-: "):
            continue
        key_cell, value = cells[0], cells[header.index("default")] if len(cells) > header.index("default") else ""
        if (m := re.fullmatch(r"`([\w.]+)`", key_cell)) and m[1] in KEYS:
            yield n, m[1], value


@pytest.mark.parametrize("page", [p for p in PAGES if p.name != "config.md" or p.parent.name != "reference"],
                         ids=lambda p: str(p.relative_to(REPO / "docs")))
def test_every_default_a_page_states_is_the_configs(page):
    wrong = [f"{where(page, n)}: `{key}` (default {value}), but the config's default is "
             f"{' or '.join(sorted(KEYS[key][1]))}" for n, key, value in stated_defaults(page)
             if key in KEYS and not _same(value, KEYS[key][1])]
    assert not wrong, "\n".join(wrong)


def test_the_checker_reads_keys_defaults_and_tables(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Set `task.reward_fail_window` (default 50) and `transport.group_port=0`; `task.no_such_key`.\n"
                    "`learner.log` and `model.generate()` are no keys. `task.reward_workers` (default 9), `task.max_turns` (3)\n\n"
                    "| key | default |\n|---|---|\n| `task.reward_timeout_s` | 30 s |\n| `task.max_turns` | 7 |\n")
    assert [k for _n, k, _r in spans(page)] == ["task.reward_fail_window", "transport.group_port", "task.no_such_key",
                                                "task.reward_workers", "task.max_turns", "task.reward_timeout_s",
                                                "task.max_turns"]
    assert [k for _n, k, _r in spans(page) if not known(k)] == ["task.no_such_key"]
    found = [(k, v, _same(v, KEYS[k][1])) for _n, k, v in stated_defaults(page)]
    assert found == [("task.reward_fail_window", "50", True), ("task.reward_workers", "9", False),
                     ("task.max_turns", "3", False), ("task.reward_timeout_s", "30 s", True), ("task.max_turns", "7", False)]
    assert known("monitoring.*_port") and known("task.verifiers_args.symbols") and not known("task.nope.x")


EXTRAS = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
INSTALL = re.compile(r"pip install(?: -q)? (?P<what>-e [^\s`]+|'?streamrl[^\s`]*)")


def install_lines():
    """(page, line number, what is installed) of every pip install of streamrl on the README and the docs, but in a
    block of a program's output (```text: an error message quoting its own advice)."""
    for page in [REPO / "README.md", *PAGES]:
        fence = None
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith("```"):
                fence = None if fence is not None else line.lstrip()[3:].strip()
                continue
            if fence not in (None, "", "bash", "sh", "shell", "console"):
                continue
            for m in INSTALL.finditer(line):
                yield page, n, m["what"].strip("`")


def test_every_install_line_is_the_readmes_with_a_real_extra():
    readme = [w for p, _n, w in install_lines() if p.name == "README.md"]
    assert "-e ." in readme  # the README's own form, which every page follows
    wrong = []
    for page, n, what in install_lines():
        m = re.fullmatch(r"-e (?:\.|'\.\[(?P<extras>[\w,-]+)\]'|\"\.\[(?P<dq>[\w,-]+)\]\")", what)
        if m is None:
            if what != "streamrl" and not what.startswith("-e"):  # `pip install streamrl`: the wheel (recipes.md)
                wrong.append(f"{where(page, n)}: `pip install {what}`: the README installs from the checkout "
                             "(`pip install -e .`, an extra as `pip install -e '.[name]'`)")
            continue
        for extra in (m["extras"] or m["dq"] or "").split(","):
            if extra and extra not in EXTRAS:
                wrong.append(f"{where(page, n)}: extra {extra!r} is not in pyproject.toml's {sorted(EXTRAS)}")
    assert not wrong, "\n".join(wrong)



EXAMPLE_BLOCK = re.compile(r"^```\w*\n# (?P<file>examples/\S+)[^\n]*\n(?P<body>.*?)^```", re.S | re.M)


def test_every_example_a_page_shows_is_the_files_lines():
    """A block headed `# examples/<file>` shows lines of that file, in order (lines may be left out, never
    changed): the file is what the tests and the example run."""
    wrong = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in EXAMPLE_BLOCK.finditer(text):
            path, at = REPO / m["file"], text[:m.start("body")].count("\n") + 1
            if not path.is_file():
                wrong.append(f"{where(page, at - 1)}: {m['file']}: no such file")
                continue
            lines, i = path.read_text(encoding="utf-8").splitlines(), 0
            for k, line in enumerate(m["body"].splitlines()):
                try:
                    i = lines.index(line, i) + 1
                except ValueError:
                    wrong.append(f"{where(page, at + k)}: {line.strip()!r} is not (in this order) a line of {m['file']}")
                    break
    assert not wrong, "\n".join(wrong)


def test_every_page_that_speaks_of_unscored_samples_links_the_one_rule():
    """What a sample nobody could score becomes is stated once (faults-and-security.md#could-not-score); a page that
    speaks of it links there rather than saying it again (the generated reference quotes docstrings, and is exempt)."""
    home = REPO / "docs" / "guides" / "faults-and-security.md"
    assert '## Could not score' in home.read_text(encoding="utf-8")
    exempt = {home, REPO / "docs" / "reference" / "config.md"}
    wrong = [str(p.relative_to(REPO)) for p in PAGES if p not in exempt
             and "unscored" in (text := p.read_text(encoding="utf-8").lower()) and "#could-not-score" not in text]
    assert not wrong, f"pages that speak of unscored samples without linking #could-not-score: {wrong}"
