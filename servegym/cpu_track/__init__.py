"""The CPU track: vLLM's CPU build serving ``servegym-tiny``, a small model built locally.

``servegym setup cpu`` prepares it (:mod:`servegym.cpu_track.setup`); everything it makes
lives under the ServeGym data directory (:mod:`servegym.engines.cpu_home`).
"""
