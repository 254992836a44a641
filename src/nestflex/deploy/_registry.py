"""The one registry behind everything users choose by name (timm's ``_registry.py`` pattern).

Codecs (:mod:`nestflex.deploy.codec`), schedulers (:mod:`nestflex.deploy.scheduler`), confidence
measures (:mod:`nestflex.deploy.exits`) and exit heads (:mod:`nestflex.exits.heads`) each keep
their public ``register_*`` / ``list_*`` / ``get_*`` functions; this class is what they share:
the name check, the overwrite rule, the sorted listing and the "unknown name" error, which names
the kind of thing, echoes the bad name, lists the known ones and ends with a ``HINT:`` (a close
match when there is one, else how to register one's own).

Pure Python on purpose: the light runtime imports it (DESIGN invariant 6).
"""

from __future__ import annotations

import difflib
from typing import Any, Callable, Generic, Iterator, TypeVar

__all__ = ["Registry"]

T = TypeVar("T")

#: Default message for an unknown name. Fields: ``kind``, ``name`` (the bad key as given),
#: ``choices`` (known names, comma-separated), ``known`` (their sorted list), ``hint``.
UNKNOWN = "unknown {kind} `{name}`; choose from: {choices}. HINT: {hint}"
#: Default message for a name that is taken. Fields: ``kind``, ``name``.
TAKEN = "{kind} `{name}` is already registered. HINT: pass overwrite=True to replace it, or pick another name"


class Registry(Generic[T]):
    """Names mapped to entries (factories, functions or objects) of one kind.

    Args:
        kind: what an entry is, in words, for messages (``"codec"``, ``"exit head"``).
        error: the exception type raised (the package's own, a :class:`~nestflex.errors.NestflexError`).
        accepts: predicate for values :meth:`get` returns as they are instead of looking them up
            (an instance of the base class, or any callable); ``None``: names only.
        callable_entries: entries must be callable (factories and functions, not objects).
        register_hint: the ``HINT:`` of an unknown name with no close match, e.g.
            ``"register your own with `register_codec(codec)`"``.
        unknown: format of the unknown-name message (fields: see :data:`UNKNOWN`).
        taken: format of the name-taken message (fields: see :data:`TAKEN`).

    Examples:
        >>> colours = Registry("colour", ValueError, register_hint="register it first")
        >>> red = colours.register("red", lambda: (255, 0, 0))
        >>> @colours.register("green")
        ... def green():
        ...     return (0, 255, 0)
        >>> colours.names(), colours.get("green")()
        (['green', 'red'], (0, 255, 0))
        >>> colours.get("gren")
        Traceback (most recent call last):
        ...
        ValueError: unknown colour `gren`; choose from: green, red. HINT: did you mean `green`?
    """

    def __init__(
        self,
        kind: str,
        error: type[Exception],
        *,
        accepts: Callable[[Any], bool] | None = None,
        callable_entries: bool = True,
        register_hint: str = "register your own first",
        unknown: str = UNKNOWN,
        taken: str = TAKEN,
    ) -> None:
        self.kind = kind
        self.error = error
        self._accepts = accepts
        self._callable_entries = callable_entries
        self._register_hint = register_hint
        self._unknown = unknown
        self._taken = taken
        self._entries: dict[str, T] = {}

    def register(self, name: str, entry: T | None = None, *, overwrite: bool = False) -> Any:
        """Add ``entry`` under ``name`` and return it; without ``entry``, a decorator that does.

        Raises:
            error: ``name`` is not a non-empty string, is taken (and ``overwrite`` is false), or
                the entry is not callable where entries must be.
        """
        if not isinstance(name, str) or not name:
            raise self.error(f"{self.kind} `name` must be a non-empty string, got {name!r}.")

        def add(obj: T) -> T:
            if self._callable_entries and not callable(obj):
                raise self.error(f"{self.kind} {name!r} must be callable, got {type(obj).__name__}.")
            if name in self._entries and not overwrite:
                raise self.error(self._taken.format(kind=self.kind, name=name))
            self._entries[name] = obj
            return obj

        return add if entry is None else add(entry)

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def get(self, key: Any) -> T:
        """The entry registered as ``key``, or ``key`` itself when ``accepts(key)`` holds.

        Raises:
            error: unknown name; the message lists the known names and ends with a ``HINT:``.
        """
        if self._accepts is not None and self._accepts(key):
            return key
        if isinstance(key, str) and key in self._entries:
            return self._entries[key]
        raise self.unknown(key)

    def unknown(self, key: Any) -> Exception:
        """The error for an unknown ``key`` (for callers that check a name before using it)."""
        close = difflib.get_close_matches(key, list(self._entries), n=1) if isinstance(key, str) else []
        hint = f"did you mean `{close[0]}`?" if close else self._register_hint
        names = self.names()
        return self.error(
            self._unknown.format(kind=self.kind, name=key, choices=", ".join(names), known=names, hint=hint)
        )

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"
