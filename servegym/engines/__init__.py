"""Serving engines: the engine-neutral ServingConfig, real-engine launchers, the simulator."""
