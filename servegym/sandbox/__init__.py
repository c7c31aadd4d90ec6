"""Where agent actions and servers run: sandboxes (Docker for the gpu and cpu tracks).

A sandbox is one class plus one :func:`servegym.sandbox.registry.register_sandbox` call;
:func:`servegym.sandbox.registry.get_sandbox` finds it by name.
"""
