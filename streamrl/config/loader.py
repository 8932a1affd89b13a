"""Reading a config: YAML files (with `extends`), dotted `key=value` overrides, and the one-line messages a bad
key or value fails with (`ConfigError`); and writing one back (`dump`, `overrides_for`)."""

from __future__ import annotations

import difflib
import logging
import re
import types
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

import msgspec
import yaml
from msgspec import Meta, Struct

from streamrl import resources
from streamrl.config.base import ConfigError
from streamrl.config.root import Config
from streamrl.config import plugged
from streamrl.config.plugged import PluginSection
from streamrl.registry import OptionError

log = logging.getLogger("streamrl.config")


DEFAULT_CONFIG = resources.recipes_dir() / "tiny.yaml"


def load(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML config (None: the tiny CPU default), apply `key=value` overrides, validate.

    A file may start from another with `extends: other.yaml` (relative to itself, else a shipped recipe's
    name); its own keys win, section by section. `path`: a file, or a shipped recipe's name (resources.recipe).
    """
    raw = {}
    if path is not None:
        try:
            found = resources.recipe(path)
        except resources.RecipeNotFound as e:
            raise ConfigError(str(e)) from None
        log.debug("config: reading %s", found)
        raw = _read(found, ())
    for item in overrides:
        _apply_override(raw, item)
    return from_dict(raw)


def _read(p: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} not found" + (f" (extended by {chain[-1]})" if chain else ""))
    if p.resolve() in chain:
        raise ConfigError(f"{p}: 'extends' loops back to itself ({' -> '.join(map(str, chain))})")
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(_yaml_error(p, e)) from None
    if raw is None:  # an empty file would silently run the default job
        raise ConfigError(f"{p}: the file is empty (no keys); give the settings to change, or `extends: tiny.yaml`")
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: top level must be a mapping of keys, got {type(raw).__name__}")
    base = raw.pop("extends", None)
    if base is None:
        return raw
    if not isinstance(base, str):
        raise ConfigError(f"{p}: extends={base!r}: must be a path to another YAML config")
    parent = p.parent / base
    if not parent.is_file():  # a user's file may extend a shipped recipe by name (`extends: paper/corpo.yaml`)
        parent = resources.shipped_recipe(base) or parent  # neither: _read names the file and who extends it
    return _merge(_read(parent, (*chain, p.resolve())), raw)


def _yaml_error(p: Path, e: yaml.YAMLError) -> str:
    """'FILE:LINE:COLUMN: not valid YAML: PROBLEM (CONTEXT)', from PyYAML's marks (0-based)."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(p)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    context = getattr(e, "context", None)
    return f"{where}: not valid YAML: {problem}" + (f" ({context})" if context else "")


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# Levels are often thirds or sixths: these settings take a fraction written "1/3" as well as a number.
FRACTION_KEYS = (("task", "reward_levels"), ("reward", "bucket_edges"), ("reward", "bucket_values"),
                 ("advantage", "r_min_correct"))
_FRACTION = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)\s*$")


def _fraction(v: Any) -> Any:
    """"1/3" → 1/3 as a float; anything else as it is (the type check then says what is allowed)."""
    if isinstance(v, str) and (m := _FRACTION.match(v)) and float(m.group(2)) != 0:
        return float(m.group(1)) / float(m.group(2))
    return v


def _fractions(raw: dict[str, Any]) -> dict[str, Any]:
    out = dict(raw)
    for section, key in FRACTION_KEYS:
        if isinstance(out.get(section), dict) and key in out[section]:
            v = out[section][key]
            out[section] = {**out[section], key: [_fraction(x) for x in v] if isinstance(v, list) else _fraction(v)}
    return out


def plugin_sections() -> dict[str, type[PluginSection]]:
    """section → its Struct, for every section whose keys name plug-ins (their other keys are those plug-ins')."""
    hints = get_type_hints(Config)
    return {k: t for k, t in hints.items() if isinstance(t, type) and issubclass(t, PluginSection)}


PLUGIN_SECTIONS = {name: cls.SELECTORS for name, cls in plugin_sections().items()}
"""section → ((the key naming a plug-in, its registry), ...), for the reference docs and tests."""


def _parse_options(raw: dict[str, Any]) -> dict[str, Any]:
    """A plug-in section's keys beyond its own fields, parsed by the Structs of the plug-ins it names into its
    `opts`, here, where a refused one can say what is allowed (a name no registry knows is left to the section,
    which lists the valid ones)."""
    out = dict(raw)
    for section, cls in plugin_sections().items():
        keys = out.get(section, {})
        if not isinstance(keys, dict):
            continue
        fields = cls.__struct_fields__
        values = {k: keys.get(k, getattr(cls(), k)) for k, _ in cls.SELECTORS}
        try:
            opts = plugged.parse_section(cls, values, {k: v for k, v in keys.items() if k not in fields}, section)
        except OptionError as e:
            raise ConfigError(f"config error: {section}.{e}{_allowed_option(cls, values, e.key)}") from None
        except ValueError as e:
            raise ConfigError(f"config error: {section}.{e}") from None
        out[section] = {**{k: v for k, v in keys.items() if k in fields}, "opts": opts}
    return out


def _allowed_option(cls: type[PluginSection], values: dict[str, Any], key: str) -> str:
    for reg, name in plugged.selected(cls, values):
        hints = get_type_hints(reg.options(name), include_extras=True) if reg.options(name) else {}
        if key in hints:
            return f"; allowed: {_describe(hints[key])}"
    return ""


def from_dict(raw: dict[str, Any]) -> Config:
    _check_keys(raw, Config, "")
    raw = _parse_options(raw)
    try:
        return msgspec.convert(_fractions(raw), Config, strict=False)
    except msgspec.ValidationError as e:
        raise ConfigError(_explain(str(e), raw)) from None


def to_dict(cfg: Config) -> dict[str, Any]:
    """The config as plain data, each plug-in's options back among its section's keys (as a file writes them)."""
    out = msgspec.to_builtins(cfg)
    for section in plugin_sections():
        out[section] = plugged.flatten(out[section])
    return out


def dump(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def overrides_for(cfg: Config) -> list[str]:
    """The dotted overrides that rebuild `cfg` from defaults (how `streamrl run` hands it on)."""
    out: list[str] = []

    def walk(d: dict[str, Any], prefix: str) -> None:
        for k, v in d.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            else:
                text = yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...").strip()
                out.append(f"{prefix}{k}={text}")

    walk(to_dict(cfg), "")
    return out


def _apply_override(raw: dict[str, Any], item: str) -> None:
    key, sep, text = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {item!r} is not key=value (e.g. advantage.estimator=grpo)")
    try:
        value = yaml.safe_load(text) if text else ""
    except yaml.YAMLError:
        value = text
    node = raw
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {item!r}: {part!r} is a value, not a section")
        node = child
    node[parts[-1]] = value


def _check_keys(raw: dict[str, Any], struct: type, prefix: str) -> None:
    hints = get_type_hints(struct)
    fields = struct.__struct_fields__
    for key, value in raw.items():
        where = f"{prefix}{key}"
        if key not in fields and isinstance(struct, type) and issubclass(struct, PluginSection):
            continue  # a plug-in's option: the Structs of the plug-ins the section names check it
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f" (did you mean {prefix + close[0]!r}?)" if close else ""
            section = f"under {prefix[:-1]!r}" if prefix else "at top level"
            raise ConfigError(f"unknown config key {where!r}{hint}; valid keys {section}: {', '.join(fields)}")
        sub = hints[key]
        if isinstance(sub, type) and issubclass(sub, Struct):
            if not isinstance(value, dict):
                keys = ", ".join(sub.__struct_fields__)
                raise ConfigError(f"config key {where!r} is a section ({keys}), got {value!r}")
            _check_keys(value, sub, where + ".")


def _explain(message: str, raw: dict[str, Any]) -> str:
    """Turn msgspec's 'Expected ... - at `$.a.b`' into 'a.b=VALUE: ...; allowed: ...'."""
    m = re.search(r" - at `\$\.?([^`]*)`", message)
    path = m.group(1) if m else ""
    reason = message[: m.start()] if m else message
    value: Any = raw
    for part in path.split(".") if path else []:
        part = re.sub(r"\[\d+\]$", "", part)
        value = value.get(part) if isinstance(value, dict) else None
    own = re.match(r"([\w.]+)=", reason)
    if own:  # raised by a section's __post_init__: it names its own field and what is allowed
        return f"config error: {path + '.' if path else ''}{reason}"
    allowed = _allowed(path)
    text = f"config error: {path}={value!r}: {reason}" if path else f"config error: {reason}"
    return text + (f"; allowed: {allowed}" if allowed and "valid:" not in reason else "")


def _allowed(path: str) -> str:
    typ: Any = Config
    for part in path.split(".") if path else []:
        item = re.search(r"\[\d+\]$", part)
        part = re.sub(r"\[\d+\]$", "", part)
        try:
            typ = get_type_hints(typ, include_extras=True)[part]
        except (KeyError, TypeError):
            return ""
        if item and get_origin(typ) in (list, tuple) and get_args(typ):  # one element of a list
            typ = get_args(typ)[0]
    return _describe(typ)


def _describe(typ: Any) -> str:
    """'int ≥ 0', 'async, strict', 'int > 0 or None', ... for the types config fields use."""
    if get_origin(typ) is Annotated:
        base, *metas = get_args(typ)
        bounds = [f"{k} {v}" for m in metas if isinstance(m, Meta) for k, v in
                  (("≥", m.ge), (">", m.gt), ("≤", m.le), ("<", m.lt)) if v is not None]
        return f"{base.__name__} {' and '.join(bounds)}"
    if get_origin(typ) is Literal:
        return ", ".join(map(str, get_args(typ)))
    if get_origin(typ) in (Union, types.UnionType):
        return " or ".join("None" if a is type(None) else _describe(a) for a in get_args(typ))
    if get_origin(typ) is list and get_args(typ):
        return f"list of {_describe(get_args(typ)[0])}"
    return getattr(typ, "__name__", "")
