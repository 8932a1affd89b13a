"""One registry for every kind of plug-in: tasks, environments, objectives (losses), advantage estimators,
generation backends and experiment trackers (docs/guides/extend.md).

A plug-in is a name, the thing it names (a class or function), its options (a msgspec Struct whose fields are
the keys it adds to its config section, each with a one-line docstring) and its capabilities (flags from
`CAPABILITIES` saying what it supports). Code asks the registry what a plug-in can do (`can`), never compares
its name to a string.

Each kind reads the entry-point group `streamrl.<kind>s` of the installed packages (streamrl's own plug-ins are
declared there too, in its pyproject.toml), so every process sees the same plug-ins without importing anything
first; an entry point's module is imported only when the plug-in is looked up. `register(name)` adds one
inside one process (tests, notebooks). An entry point names either a `Plugin` (whose `load` names the
implementation, imported only when it is used: a backend's capabilities are known without importing its
engine) or the implementation itself, which may carry `Options` and `capabilities` attributes.
"""

from __future__ import annotations

import functools
import importlib
import re
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Callable, Generic, TypeVar

import msgspec

T = TypeVar("T")

CAPABILITIES = {
    "episodes": "task: its samples are multi-turn episodes of an environment (the episode runtime runs them)",
    "agent_rollout": "task: its samples are agent episodes that call the actor's OpenAI-compatible endpoint",
    "rows": "task: reads training rows from task.data (and needs them)",
    "names_environment": "task: adapts the environment task.environment names, and needs it",
    "reward_functions": "task: scores with the functions task.reward names (`streamrl check` calls them first)",
    "declared_levels": "task: its reward's scale is the config's to declare (task.reward_levels or bucket_edges)",
    "inflight_updates": "backend: loads new weights between decoding steps, not only between generate calls",
    "inflight_lora": "backend: a LoRA update reaches requests already running (in-flight updates with lora.rank)",
    "tensor_parallel": "backend: shards one engine over several GPUs (actors.tensor_parallel_size)",
    "engine_memory": "backend: its engine reserves a share of its GPU's memory (actors.gpu_memory_fraction)",
    "collective_sync": "backend: takes weights by a collective broadcast (transport.weight_sync=collective)",
    "collective_in_engine": "backend: its engine's workers are the collective's ranks and load each version themselves",
    "collective_named_group": "backend: its workers join and take the collective in their engine's own convention "
                              "(SGLang's init_weights_update_group, one flat broadcast per bucket: named_group)",
    "ipc_sync": "backend: takes weights from CUDA IPC handles to the learner's GPU memory (weight_sync=ipc)",
    "ipc_in_engine": "backend: its engine loads each IPC version itself (the actor keeps no copy of the weights)",
    "full_logprobs": "backend: behaviour log-probs are of the untruncated distribution under top_p < 1",
    "cpu_fork": "backend: a CPU actor may start as a fork of a warm process",
    "device_choice": "backend: runs on the device actors.device names (cpu: the actors take no GPU)",
    "api_key_needed": "tracker: needs an API key to log online (checked before the run starts)",
}
"""Every capability flag a plug-in may declare, and what it means."""


class Options(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The base of a plug-in's options: its fields are the keys it adds to its config section (one-line docstring
    each, where the config reference shows them); `__post_init__` validates them where the plug-in lives."""


@dataclass(frozen=True)
class Plugin:
    """One plug-in: what it is (`item`, or `load`: 'module:attr' imported on first use), its options and flags."""

    item: Any = None
    load: str | None = None
    options: type[msgspec.Struct] | None = None
    capabilities: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if self.item is not None:  # what the implementation carries itself counts too
            object.__setattr__(self, "options", self.options or getattr(self.item, "Options", None))
            object.__setattr__(self, "capabilities", {*self.capabilities, *getattr(self.item, "capabilities", ())})
        bad = sorted(set(self.capabilities) - set(CAPABILITIES))
        if bad:
            raise ValueError(f"capabilities {bad}: unknown; valid: {', '.join(sorted(CAPABILITIES))}")
        object.__setattr__(self, "capabilities", frozenset(self.capabilities))

    @classmethod
    def of(cls, obj: Any) -> Plugin:
        """`obj` as a Plugin: itself, or an implementation with optional `Options` / `capabilities` attributes."""
        return obj if isinstance(obj, Plugin) else cls(item=obj)

    def implementation(self) -> Any:
        if self.item is None and self.load is not None:
            module, _, attr = self.load.partition(":")
            object.__setattr__(self, "item", getattr(importlib.import_module(module), attr))
        return self.item


@functools.lru_cache(maxsize=None)
def entry_points(group: str) -> dict[str, metadata.EntryPoint]:
    """name → entry point in `group`; two packages claiming one name is an error naming both."""
    found: dict[str, metadata.EntryPoint] = {}
    for ep in metadata.entry_points(group=group):
        other = found.get(ep.name)
        if other is not None and other.value != ep.value:
            first, second = sorted([other, ep], key=dist_of)  # sys.path's order varies: name them in a fixed one
            raise ValueError(f"{ep.name!r} is declared twice in entry-point group {group!r}: "
                             f"{first.value} ({dist_of(first)}) and {second.value} ({dist_of(second)}); uninstall one")
        found[ep.name] = ep
    return found


def dist_of(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else "unknown distribution"


class Registry(Generic[T]):
    """name → plug-in of one kind: registered in this process, or an installed entry point of `group`."""

    def __init__(self, kind: str, group: str | None = None, own: str | None = None, modules: tuple[str, ...] = (),
                 defaults: str | None = None):
        self.kind = kind
        self.group = group
        self.own = own  # the module prefix of streamrl's own entry points in `group`, which must be installed
        self.modules = modules  # streamrl's modules that register its own plug-ins of this kind, imported on first use
        self.defaults = defaults  # "module:Class": the optional members of this kind with their defaults (`member`)
        self._plugins: dict[str, Plugin] = {}

    def _installed(self) -> dict[str, metadata.EntryPoint]:
        for module in self.modules:  # lazily: the config may ask for a name without importing every plug-in
            importlib.import_module(module)
        found = entry_points(self.group) if self.group else {}
        if self.own and not any(ep.value.startswith(self.own) for ep in found.values()):
            # An install made before these became entry points (or a checkout on PYTHONPATH) has none of its own.
            raise ValueError(f"streamrl's own {self.kind}s are missing from entry-point group {self.group!r}: its "
                             "installed metadata predates them; reinstall streamrl (pip install -e <repository>)")
        return found

    def register(self, name: str, *, options: type[msgspec.Struct] | None = None,
                 capabilities: tuple[str, ...] | frozenset[str] = ()) -> Callable[[T], T]:
        """A decorator adding `item` as `name` with its options and capability flags; a taken name is an error."""
        def add(item: T) -> T:
            if name in self._plugins:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            ep = self._installed().get(name)
            if ep is not None and ep.value != f"{getattr(item, '__module__', '')}:{getattr(item, '__qualname__', '')}":
                raise ValueError(f"{self.kind} {name!r} is already installed as an entry point ({ep.value}, "
                                 f"{dist_of(ep)})")
            self._plugins[name] = Plugin(item=item, options=options, capabilities=frozenset(capabilities))
            return item

        return add

    def plugin(self, name: str) -> Plugin:
        """The plug-in `name` (an entry point's module is imported here, once)."""
        installed = self._installed()
        if name in self._plugins:
            return self._plugins[name]
        ep = installed.get(name)
        if ep is None:
            raise KeyError(self.unknown(name))
        try:
            found = Plugin.of(ep.load())
        except Exception as e:  # a broken plug-in names itself rather than failing deep in a run
            raise ValueError(f"{self.kind} {name!r}: cannot load entry point {ep.value} ({dist_of(ep)}): "
                             f"{type(e).__name__}: {e}") from e
        return self._plugins.setdefault(name, found)

    def get(self, name: str) -> T:
        plugin = self.plugin(name)
        try:
            return plugin.implementation()
        except Exception as e:
            raise ValueError(f"{self.kind} {name!r}: cannot load {plugin.load}: {type(e).__name__}: {e}") from e

    def options(self, name: str) -> type[msgspec.Struct] | None:
        """The Struct of the keys `name` adds to its section (None: it adds none)."""
        return self.plugin(name).options

    def can(self, name: str, capability: str) -> bool:
        """Whether plug-in `name` declares `capability` (one of CAPABILITIES)."""
        if capability not in CAPABILITIES:
            raise ValueError(f"capability {capability!r}: unknown; valid: {', '.join(sorted(CAPABILITIES))}")
        return capability in self.plugin(name).capabilities

    def with_capability(self, capability: str) -> list[str]:
        """The names of the plug-ins that declare `capability` (loads each one's entry point)."""
        return [n for n in self.names() if self.can(n, capability)]

    def member(self, item: Any, name: str) -> Any:
        """A plug-in's (or its class's) optional member `name`, or the default of its kind's `defaults` class for
        one that lacks it (bound to the plug-in where the default is a method). Read once where a plug-in is built,
        never per call."""
        defaults = _load(self.defaults) if self.defaults else object
        if name not in vars(defaults):
            raise AttributeError(f"{name!r} is not an optional {self.kind} member ({self.defaults})")
        if isinstance(item, defaults) or (isinstance(item, type) and issubclass(item, defaults)):
            return getattr(item, name)
        own = getattr(item, name, _MISSING)
        if own is not _MISSING:
            return own
        default = vars(defaults)[name]
        if isinstance(default, staticmethod):
            return default.__func__
        if callable(default) and not isinstance(item, type):
            return default.__get__(item)
        return default

    def unknown(self, name: object) -> str:
        return f"unknown {self.kind} {name!r}; valid: {', '.join(self.names())}"

    def names(self) -> list[str]:
        installed = self._installed()
        return sorted({*self._plugins, *installed})

    def __contains__(self, name: object) -> bool:
        installed = self._installed()  # first: it imports the modules that register streamrl's own
        return name in self._plugins or name in installed

    def origin(self, name: str) -> str:
        """Where a plug-in comes from: its entry point and distribution, or the module that registered it."""
        ep = self._installed().get(name)
        if ep is not None:  # a Plugin that loads its implementation later: that implementation is where it lives
            return f"{self.plugin(name).load or ep.value} (entry point, {dist_of(ep)})"
        if name in self._plugins:
            item = self._plugins[name].item
            return f"{item.__module__}:{item.__qualname__} (registered in this process only)"
        raise KeyError(self.unknown(name))


def parse_options(reg: Registry, name: str, raw: dict[str, Any]) -> msgspec.Struct | None:
    """`raw` (keys the plug-in's options have: `streamrl.config.plugged.parse_section` decides which keys reach it)
    as plug-in `name`'s options, validated by its Struct. Errors read 'KEY=VALUE: why' (the config loader prefixes
    the section): the key, the plug-in, what it takes."""
    opts = reg.options(name)
    fields = opts.__struct_fields__ if opts is not None else ()
    if opts is None:
        return None
    try:
        return msgspec.convert(raw, opts, strict=False)
    except msgspec.ValidationError as e:
        if re.match(r"[\w.]+=", str(e)):  # raised by the options' own __post_init__: it names its field
            raise ValueError(str(e)) from None
        m = re.search(r"(.*?)(?: - at `\$\.(\w+)[^`]*`)?$", str(e))
        key = m.group(2) or next((f for f in fields if f"`{f}`" in str(e)), "")
        return _refused(key, raw.get(key), f"{reg.kind} {name!r}: {m.group(1)}")


class OptionError(ValueError):
    """A plug-in's option is refused; `key` names it (the config loader adds what its type allows)."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


_MISSING = object()


@functools.cache
def _load(path: str) -> Any:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def _refused(key: str, value: Any, why: str) -> Any:
    raise OptionError(key, f"{key}={value!r}: {why}")


TASKS: Registry = Registry("task", "streamrl.tasks", own="streamrl.tasks.", defaults="streamrl.tasks.base:TaskDefaults")
ENVIRONMENTS: Registry = Registry("environment", "streamrl.environments")
LOSSES: Registry = Registry("loss", "streamrl.losses", own="streamrl.algo.")
ESTIMATORS: Registry = Registry("advantage estimator", "streamrl.estimators", modules=("streamrl.algo.advantages",))
BACKENDS: Registry = Registry("generation backend", "streamrl.backends", own="streamrl.actors.backends.")
TRACKERS: Registry = Registry("tracker", "streamrl.trackers", modules=("streamrl.telemetry.trackers",))
TOOL_PARSERS: Registry = Registry("tool-call parser", modules=("streamrl.tasks.tool_calls",))
"""How an agent's or environment's tool calls are read from a model's reply (`task.tool_parser`)."""
KINDS = {"task": TASKS, "environment": ENVIRONMENTS, "loss": LOSSES, "estimator": ESTIMATORS, "backend": BACKENDS,
         "tracker": TRACKERS}
"""Every kind of plug-in, by the word the docs use for it."""
