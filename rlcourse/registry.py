"""A tiny registry: the loop's swappable parts are registered by name and looked up by name.

The chapters' parts live in :mod:`rlcourse.methods` and register themselves when that package is
imported. Nothing else needs to import it: a name the registry does not know yet, or a listing of all
names, first imports :mod:`rlcourse.methods` (once). So the trainer knows only the registries, and
the methods know only the registries they register in; there is no import cycle between them.
"""
from __future__ import annotations

import importlib
from typing import Callable, Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """Names -> callables, for one kind of part (e.g. ``"advantage estimator"``)."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, F] = {}

    def register(self, name: str, *, overwrite: bool = False) -> Callable[[F], F]:
        """Decorator that registers a callable under ``name``."""

        def deco(fn: F) -> F:
            if name in self._items and not overwrite:
                raise ValueError(f"{self.kind} {name!r} is already registered (pass overwrite=True to replace it)")
            self._items[name] = fn
            return fn

        return deco

    def get(self, name: str | F) -> F:
        """The callable registered as ``name`` (a callable passes through unchanged)."""
        if callable(name):
            return name
        if name not in self._items:
            load_methods()
        if name not in self._items:
            raise ValueError(f"unknown {self.kind} {name!r}; registered: {sorted(self._items)}")
        return self._items[name]

    def names(self) -> list[str]:
        """Every registered name, the chapters' parts included."""
        load_methods()
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        if name not in self._items:
            load_methods()
        return name in self._items


def load_methods() -> None:
    """Import :mod:`rlcourse.methods` (which registers the chapters' parts); a no-op after the first call."""
    importlib.import_module("rlcourse.methods")
