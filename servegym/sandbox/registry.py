"""The sandbox registry: a new sandbox is one class plus one :func:`register_sandbox` call."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Protocol

from servegym.errors import UserError


class Sandbox(Protocol):
    """Anything that can run a server in isolation and say whether it can run here."""

    def available(self) -> str | None:
        """None when this sandbox can run on this machine, else the reason (one line)."""
        ...


SandboxFactory = Callable[..., Sandbox]

_SANDBOXES: dict[str, SandboxFactory] = {}

_BUILTIN_MODULES = {
    "docker": "servegym.sandbox.docker_runner",
    "local": "servegym.sandbox.local",
}
"""Modules that register a built-in sandbox, imported on first use (keeps imports light)."""


def register_sandbox(name: str) -> Callable[[SandboxFactory], SandboxFactory]:
    """Class decorator: make a sandbox findable by ``name``."""

    def deco(cls: SandboxFactory) -> SandboxFactory:
        _SANDBOXES[name] = cls
        return cls

    return deco


def sandbox_names() -> list[str]:
    """The names of every known sandbox, built-in ones included."""
    for module in _BUILTIN_MODULES.values():
        importlib.import_module(module)
    return sorted(_SANDBOXES)


def get_sandbox(name: str) -> SandboxFactory:
    """The sandbox class registered as ``name``; a :class:`UserError` names the known ones."""
    if name not in _SANDBOXES and name in _BUILTIN_MODULES:
        importlib.import_module(_BUILTIN_MODULES[name])
    if name not in _SANDBOXES:
        known = ", ".join(sorted(set(_SANDBOXES) | set(_BUILTIN_MODULES)))
        raise UserError(f"unknown sandbox '{name}' (known: {known})")
    return _SANDBOXES[name]
