"""The sandbox registry: a new sandbox is one class plus one :func:`register_sandbox` call,
or an entry point of the ``servegym.sandboxes`` group (:mod:`servegym.registry`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from servegym.registry import Registry


class Sandbox(Protocol):
    """Anything that can run a server in isolation and say whether it can run here."""

    def available(self) -> str | None:
        """None when this sandbox can run on this machine, else the reason (one line)."""
        ...


SandboxFactory = Callable[..., Sandbox]


def _is_sandbox_class(obj: object) -> bool:
    return isinstance(obj, type) and callable(getattr(obj, "available", None))


SANDBOXES: Registry[SandboxFactory] = Registry(
    "sandbox",
    group="servegym.sandboxes",
    builtins={
        "docker": "servegym.sandbox.docker_runner",
        "local": "servegym.sandbox.local",
    },
    accepts=_is_sandbox_class,
    kind_label="a sandbox class (one with an available() method)",
)
"""Every sandbox by name: the built-ins (imported on first use, which keeps imports light),
``servegym.sandboxes`` entry points, and ``package.module:Class`` specs."""


def register_sandbox(name: str) -> Callable[[SandboxFactory], SandboxFactory]:
    """Class decorator: make a sandbox findable by ``name``."""
    return SANDBOXES.register(name)


def sandbox_names() -> list[str]:
    """The names of every known sandbox, built-in ones and plug-ins included."""
    return SANDBOXES.names()


def get_sandbox(name: str) -> SandboxFactory:
    """The sandbox class registered as ``name``; a :class:`~servegym.errors.UserError`
    names the known ones."""
    return SANDBOXES.get(name)
