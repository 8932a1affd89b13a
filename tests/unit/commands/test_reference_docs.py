"""The docs site's reference pages and home page are generated (streamrl/commands/reference_docs.py): the committed
pages must be what the generator writes today, and every config key must have its row with its docstring."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from streamrl import config as config_lib
from streamrl.commands import reference_docs

REPO = Path(__file__).resolve().parents[3]


def _keys(cls: type = config_lib.Config, prefix: str = "") -> list[str]:
    """Every key a file may write: each section's fields, and in a plug-in section each of streamrl's own plug-ins'
    options (its `opts` holds them, parsed from the section's other keys)."""
    out = []
    for field in msgspec.structs.fields(cls):
        tp = field.type
        if field.name == "opts":
            out += sorted({prefix + k for _, reg in config_lib.PLUGIN_SECTIONS[prefix.rstrip(".")]
                           for n in reg.names() if (o := reg.options(n)) is not None for k in o.__struct_fields__})
        elif isinstance(tp, type) and issubclass(tp, msgspec.Struct):
            out += _keys(tp, prefix + field.name + ".")
        else:
            out.append(prefix + field.name)
    return out


@pytest.mark.parametrize("page", reference_docs.PAGES)
def test_committed_reference_page_is_what_the_generator_writes(page):
    committed = (REPO / "docs" / page).read_text(encoding="utf-8")
    assert committed == reference_docs.render()[page], (
        f"docs/{page} is out of date: run python -m streamrl.commands.reference_docs")


def test_every_config_key_has_a_row_with_its_docstring_in_the_committed_page():
    page = (REPO / "docs" / "reference" / "config.md").read_text(encoding="utf-8")
    keys = _keys()
    assert len(keys) > 50  # the walk reached the nested sections
    missing = [k for k in keys if f"| `{k}` |" not in page]
    assert not missing, f"config keys missing from docs/reference/config.md: {missing}"
    docs = reference_docs.field_docstrings(config_lib.ActorConfig)
    assert reference_docs._cell(docs["backend"]) in page
    assert {"task.verifiers_env", "task.scale_steps", "loss.clip_low", "loss.m2po_tau"} <= set(keys)


def test_each_plug_ins_options_are_listed_under_its_section():
    page = (REPO / "docs" / "reference" / "config.md").read_text(encoding="utf-8")
    task, loss = page.index("## `task`"), page.index("## `loss`")
    assert task < page.index("### `task.name`: `verifiers`") < page.index("| `task.verifiers_env` |") < loss
    assert loss < page.index("### `loss.name`: `token_pg`") < page.index("| `loss.is_cap` |")


def test_a_field_without_a_docstring_is_refused_naming_it():
    class Section(msgspec.Struct, kw_only=True):
        documented: int = 1
        """Has its line."""
        bare: int = 2

    with pytest.raises(ValueError, match=r"Section\.bare: no docstring"):
        reference_docs.config_rows(Section)


def test_types_read_as_bounds_literals_and_null():
    rows = dict((key, tp) for _section, rs in reference_docs.config_rows() for key, tp, _d, _doc in rs)
    assert rows["max_staleness"] == "int ≥ 0"
    assert rows["on_policy"] == '"async" | "strict"'
    assert rows["model.path"] == "str | null"


def test_check_mode_reports_a_stale_page(tmp_path, capsys):
    assert reference_docs.main(["--out", str(tmp_path)]) == 0
    assert reference_docs.main(["--out", str(tmp_path), "--check"]) == 0
    (tmp_path / "reference" / "config.md").write_text("stale\n", encoding="utf-8")
    assert reference_docs.main(["--out", str(tmp_path), "--check"]) == 1
    assert "config.md" in capsys.readouterr().err
