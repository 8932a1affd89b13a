"""Sections that name plug-ins (`task.name`, `task.environment`, `loss.name`, `advantage.estimator`,
`actors.backend`, `monitoring.report_to`): the section's own fields are what every run shares, and its other keys
are the named plug-ins' options, each parsed by the plug-in's Struct (streamrl.registry) and kept in `opts`.

A file writes them flat, among the section's keys (`task.verifiers_env`, `loss.clip_low`), as it always did, and
code reads them so (`cfg.loss.clip_low`), or typed (`cfg.loss.options_for(LOSSES)`)."""

from __future__ import annotations

import difflib
import logging
from typing import Any, ClassVar, TypeVar

import msgspec

from streamrl.config.base import _Section
from streamrl.registry import OptionError, Registry, parse_options

log = logging.getLogger("streamrl.config")

T = TypeVar("T", bound=msgspec.Struct)


class PluginSection(_Section):
    """A section whose SELECTORS keys name plug-ins; a subclass declares `opts` ({"kind:name": its options})."""

    SELECTORS: ClassVar[tuple[tuple[str, Registry], ...]] = ()
    """(key, registry) of each key of the section that names plug-ins of that registry's kind."""
    SECTION: ClassVar[str] = ""
    """The section's key in the config (for the errors)."""

    def __post_init__(self) -> None:
        opts = self.opts
        if not opts or not all(isinstance(v, msgspec.Struct) for v in opts.values()):  # raw keys: parse them
            self.opts = parse_section(type(self), {k: getattr(self, k) for k, _ in self.SELECTORS}, opts or {},
                                      self.SECTION)

    def options_for(self, reg: Registry) -> Any:
        """The options of the plug-in of registry `reg` this section names (None: it takes none)."""
        return next((v for k, v in self.opts.items() if k.partition(":")[0] == reg.kind), None)

    def options_as(self, reg: Registry, cls: type[T]) -> T:
        """The options of the plug-in of `reg` this section names, as `cls`: its own where that plug-in takes `cls`,
        else `cls`'s defaults (a plug-in built beside a run that names another: an hf sampler beside a vLLM engine)."""
        own = self.options_for(reg)
        return own if isinstance(own, cls) else cls()

    def options_dict(self, reg: Registry) -> dict[str, Any]:
        """The options of the plug-in of `reg` this section names, as keywords ({}: it takes none)."""
        own = self.options_for(reg)
        return msgspec.structs.asdict(own) if own is not None else {}

    def __getattr__(self, key: str) -> Any:
        # section.<option> reads a named plug-in's option: the keys a config file writes are the ones code reads
        opts = self.opts if key != "opts" else {}
        for value in opts.values():
            if key in value.__struct_fields__:
                return getattr(value, key)
        raise AttributeError(f"{type(self).__name__}: no key {key!r} (neither shared nor an option of the plug-ins "
                             f"it names: {', '.join(opts) or 'none'})")


def selected(cls: type[PluginSection], values: dict[str, Any]) -> list[tuple[Registry, str]]:
    """(registry, name) of every plug-in the section's selector values name ('module:Class' references: none)."""
    out = []
    for key, reg in cls.SELECTORS:
        value = values.get(key)
        for name in value if isinstance(value, list) else [value]:
            if isinstance(name, str) and name in reg:
                out.append((reg, name))
    return out


def parse_section(cls: type[PluginSection], values: dict[str, Any], raw: dict[str, Any],
                  section: str) -> dict[str, msgspec.Struct]:
    """The section's other keys `raw`, each given to the first named plug-in whose options have it, parsed by
    their Structs. A key only another plug-in of these kinds takes is left unread while it holds that plug-in's
    default (a file extending tiny.yaml keeps its symbol options), and an error otherwise (it would do nothing); a
    key none takes is an error naming the options the named plug-ins take."""
    plugins = selected(cls, values)
    own: dict[tuple[Registry, str], dict[str, Any]] = {p: {} for p in plugins}
    for key, value in raw.items():
        owner = next((p for p in plugins if key in _fields(p[0].options(p[1]))), None)
        if owner is not None:
            own[owner][key] = value
        elif others := [(reg, n) for reg in {r for _, r in cls.SELECTORS} for n in reg.names()
                        if key in _fields(reg.options(n))]:
            _unused(cls, values, key, value, others, section)
        else:
            takes = [f"{reg.kind} {n!r}: {', '.join(_fields(reg.options(n))) or 'none'}" for reg, n in plugins]
            known = [*cls.__struct_fields__, *(k for reg, n in plugins for k in _fields(reg.options(n)))]
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (did you mean {section + '.' + close[0]!r}?)" if close else ""
            shared = ", ".join(k for k in cls.__struct_fields__ if k != "opts")
            raise OptionError(key, f"{key}={value!r}: unknown key under {section!r}{hint}; valid keys under "
                                   f"{section!r}: {shared}, and the options of the plug-ins it names "
                                   f"({'; '.join(takes) or 'none'})")
    parsed = {f"{reg.kind}:{name}": parse_options(reg, name, keys) for (reg, name), keys in own.items()}
    return {k: v for k, v in parsed.items() if v is not None}


def _unused(cls: type[PluginSection], values: dict[str, Any], key: str, value: Any,
            others: list[tuple[Registry, str]], section: str) -> None:
    """A key of plug-ins this run does not name: unread at their default, else an error naming them, the default
    and the selector values that would make it count."""
    defaults = [_default(reg.options(n), key) for reg, n in others]
    if value in defaults:
        log.info("%s.%s=%r: an option of a plug-in this run does not use; not read", section, key, value)
        return
    named = ", ".join(f"{reg.kind} {n!r}" for reg, n in selected(cls, values)) or "none"
    owners = ", ".join(f"{reg.kind} {n!r}" for reg, n in others)
    shown = " or ".join(dict.fromkeys(repr(d) for d in defaults if d is not msgspec.NODEFAULT))
    allowed = f"its default ({shown}), or " if shown else ""
    choices = []
    for selector, reg in cls.SELECTORS:
        if names := [n for r, n in others if r is reg]:
            listed = isinstance(values.get(selector), list)
            choices.append(f"{section}.{selector}{' listing ' if listed else '='}{' or '.join(names)}")
    raise OptionError(key, f"{key}={value!r}: an option of {owners}, which this run does not name ({section} "
                           f"names {named}); it would do nothing. Allowed: {allowed}that plug-in named "
                           f"({' or '.join(choices)})")


def _default(opts: type, key: str) -> Any:
    """The default of field `key` of an options Struct (an empty list or dict is held as a factory; a required
    field has none: NODEFAULT, which no value equals)."""
    field = next(f for f in msgspec.structs.fields(opts) if f.name == key)
    if field.default is msgspec.NODEFAULT and field.default_factory is not msgspec.NODEFAULT:
        return field.default_factory()
    return field.default


def _fields(opts: type | None) -> tuple[str, ...]:
    return opts.__struct_fields__ if opts is not None else ()


def flatten(section: dict[str, Any]) -> dict[str, Any]:
    """A section as plain data (msgspec.to_builtins) with its plug-ins' options back among its keys."""
    out = dict(section)
    for value in (out.pop("opts", None) or {}).values():
        out.update(value)
    return out
