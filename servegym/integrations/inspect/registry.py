"""The ``inspect_ai`` entry point: importing it registers ServeGym's tasks with Inspect."""

from servegym.integrations.inspect import catalog, tasks

__all__ = ["catalog", "tasks"]
