"""A name → function registry that refuses duplicates and lists the valid names on a bad one.

Estimators, losses, tasks and backends each live in one of these, so a name is checked in
exactly one place.
"""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(item: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = item
            return item

        return add

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise KeyError(self.unknown(name)) from None

    def unknown(self, name: object) -> str:
        return f"unknown {self.kind} {name!r}; valid: {', '.join(self.names())}"

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items
