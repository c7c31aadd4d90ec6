"""One registry pattern for everything ServeGym finds by name: agents, engines, sandboxes,
executors and tracks.

A :class:`Registry` maps a name to a factory (usually a class) and finds it in one of four
ways, in this order:

1. **registered**: code called :meth:`Registry.register` (a class decorator) for the name;
2. **built-in**: the name is in the registry's module map (name -> module) and importing
   that module registers it. Built-ins are imported lazily, on the first lookup of their
   name, so ``servegym --help`` does not import every engine and SDK. *The module map is the
   one source of truth for built-ins*: they are not also declared as entry points, so a
   source checkout run without install metadata finds them all the same;
3. **installed plug-in**: an entry point of the registry's group (``servegym.agents``,
   ``servegym.engines``, ``servegym.sandboxes``, ``servegym.executors``,
   ``servegym.tracks``) whose name is the name. A package declares it in its own
   ``pyproject.toml``::

       [project.entry-points."servegym.agents"]
       my-agent = "my_pkg.agent:MyAgent"

   and ``--agent my-agent`` then works without ServeGym being edited. Entry points are read
   only on a miss (or when names are listed), never on the path of a known name. A plug-in
   never shadows a registered or built-in name;
4. **a spec** ``package.module:Attr``: the module is imported and the attribute taken (see
   :func:`is_spec` for what counts as one). Nothing needs installing or registering.

Whatever is found is checked to be of the registry's kind (``accepts``); a spec or a
plug-in that is not, or cannot be imported, is a :class:`~servegym.errors.UserError` of one
line naming the flag. An unknown name is one too, listing the known names.

Making a registry (the tracks' one, :data:`servegym.tracks.base.TRACKS`)::

    TRACKS: Registry[type[Track]] = Registry(
        "track",
        group="servegym.tracks",
        builtins={"sim": "servegym.tracks.sim", "cpu": "servegym.tracks.real", ...},
        accepts=lambda obj: isinstance(obj, type) and issubclass(obj, Track),
    )
    register_track = TRACKS.register   # @register_track("sim") on the class
    TRACKS.get("sim")                  # the class; TRACKS.names() for help and errors

This module is the bottom layer: it imports only the standard library and
:mod:`servegym.errors`.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Generic, TypeVar

from servegym.errors import UserError

T = TypeVar("T")

_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def is_spec(name: str) -> bool:
    """Whether ``name`` is a ``module:Attr`` spec: exactly one ``:``, with a dotted Python
    module path on its left and a (dotted) attribute name on its right, e.g.
    ``my_pkg.agent:MyAgent`` or ``my_agent:MyAgent``. Registered names never match (they
    hold no ``:``), and neither do the model agents' ``kind:model`` names whose kind is
    checked first by their registry's user (:func:`servegym.agents.base.make_agent`)."""
    module, sep, attr = name.partition(":")
    return bool(sep) and bool(_DOTTED.match(module)) and bool(_DOTTED.match(attr))


def load_spec(spec: str, *, where: str) -> object:
    """The object a ``module:Attr`` spec names; a one-line :class:`UserError` starting with
    ``where`` (the flag) when the module cannot be imported or has no such attribute."""
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name == module_name or module_name.startswith(f"{e.name}."):
            raise UserError(
                f"{where}: cannot import '{spec}': no module named '{module_name}'"
            ) from None
        raise UserError(f"{where}: cannot import '{spec}': {type(e).__name__}: {e}") from None
    except Exception as e:  # the module's own failure at import: one line, its cause
        raise UserError(f"{where}: cannot import '{spec}': {type(e).__name__}: {e}") from None
    obj: object = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UserError(
                f"{where}: cannot import '{spec}': module '{module_name}' has no attribute '{attr}'"
            ) from None
    return obj


class Registry(Generic[T]):
    """Names -> factories of one kind (see the module docstring).

    ``kind`` is what an entry is called in messages (``agent``); ``flag`` the command-line
    flag its names come from (``--agent``), which starts every message when given;
    ``accepts`` says whether an object found by a spec or a plug-in is of this kind (a
    registered or built-in one is trusted); ``kind_label`` names the kind in that refusal
    (default: ``a <kind> class``).
    """

    def __init__(
        self,
        kind: str,
        *,
        group: str,
        builtins: Mapping[str, str] | None = None,
        flag: str | None = None,
        accepts: Callable[[object], bool] | None = None,
        kind_label: str | None = None,
    ) -> None:
        self.kind = kind
        self.group = group
        self.builtins: dict[str, str] = dict(builtins or {})
        self.flag = flag
        self.accepts = accepts
        self.kind_label = kind_label or f"a {kind} class"
        self._entries: dict[str, T] = {}

    def __repr__(self) -> str:
        return f"Registry({self.kind!r})"

    # --- registering ----------------------------------------------------------------------

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: make the decorated class (or factory) findable by ``name``."""

        def deco(obj: T) -> T:
            self._entries[name] = obj
            return obj

        return deco

    def unregister(self, name: str) -> None:
        """Forget ``name`` (tests register entries for one module only)."""
        self._entries.pop(name, None)

    # --- finding ---------------------------------------------------------------------------

    @property
    def where(self) -> str:
        """How messages start: the flag, else the kind."""
        return self.flag or self.kind

    def find(self, name: str) -> T | None:
        """The entry called ``name`` (registered, built-in or plug-in), or None."""
        if name not in self._entries and name in self.builtins:
            importlib.import_module(self.builtins[name])
        if name in self._entries:
            return self._entries[name]
        plugin = self._plugin(name)
        if plugin is not None:
            self._entries[name] = plugin
        return plugin

    def get(self, name: str, *, known: Callable[[], Iterable[str]] | None = None) -> T:
        """The entry called ``name``, or the object a ``module:Attr`` spec names (checked to
        be of this kind). An unknown name raises :class:`UserError` listing ``known()``
        (default: :meth:`names`)."""
        if is_spec(name) and name not in self._entries:
            return self.load(name)
        found = self.find(name)
        if found is not None:
            return found
        raise self.unknown(name, None if known is None else known())

    def load(self, spec: str) -> T:
        """The object ``spec`` (``module:Attr``) names, checked to be of this kind."""
        return self._checked(load_spec(spec, where=self.where), spec)

    def unknown(self, name: str, known: Iterable[str] | None = None) -> UserError:
        """The one error for an unknown name, listing the known ones."""
        listed = ", ".join(sorted(self.names() if known is None else known))
        prefix = f"{self.flag}: " if self.flag else ""
        return UserError(f"{prefix}unknown {self.kind} '{name}' (known: {listed})")

    def names(self) -> list[str]:
        """Every name this registry can find: registered, built-in and installed plug-ins
        (no module is imported to list them)."""
        found = set(self._entries) | set(self.builtins)
        found.update(ep.name for ep in self._entry_points())
        return sorted(found)

    def load_builtins(self) -> None:
        """Import every built-in module (a test checks the module map against them)."""
        for module in sorted(set(self.builtins.values())):
            importlib.import_module(module)

    def registered(self) -> dict[str, T]:
        """What is registered so far (built-ins not yet imported are not)."""
        return dict(self._entries)

    # --- internals -------------------------------------------------------------------------

    def _entry_points(self) -> list[importlib.metadata.EntryPoint]:
        return list(importlib.metadata.entry_points(group=self.group))

    def _plugin(self, name: str) -> T | None:
        for ep in self._entry_points():
            if ep.name != name:
                continue
            where = f"{self.where}: plug-in '{name}' ({self.group} entry point {ep.value!r})"
            try:
                obj = ep.load()
            except Exception as e:
                raise UserError(f"{where}: cannot load: {type(e).__name__}: {e}") from None
            if self.accepts is not None and not self.accepts(obj):
                raise UserError(f"{where}: is not {self.kind_label}")
            return obj  # type: ignore[no-any-return]
        return None

    def _checked(self, obj: object, spec: str) -> T:
        if self.accepts is not None and not self.accepts(obj):
            what = (
                f"the class {obj.__name__}"
                if isinstance(obj, type)
                else f"a {type(obj).__name__} object"
            )
            raise UserError(f"{self.where}: '{spec}' is not {self.kind_label} (it is {what})")
        return obj  # type: ignore[return-value]
