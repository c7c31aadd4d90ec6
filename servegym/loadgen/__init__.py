"""The load generator: drives a workload against a target and records every request.

- :mod:`~servegym.loadgen.target`: ``RunOptions``, the ``Target`` protocol and registry.
- :mod:`~servegym.loadgen.http_target`: ``HttpTarget`` (any OpenAI-compatible server).
- :mod:`~servegym.loadgen.runner`: arrival schedules, sessions, warm-up, duration bound.
- :mod:`~servegym.loadgen.client`, :mod:`~servegym.loadgen.http1`,
  :mod:`~servegym.loadgen.sse`: one streamed request, timestamped as its bytes arrive.
- :mod:`~servegym.loadgen.selfcheck`, :mod:`~servegym.loadgen.timing`: keeping the
  schedule, and measuring how well it was kept.
- :mod:`~servegym.loadgen.prom`: ``/metrics`` deltas.
- :mod:`~servegym.loadgen.mock_server`: a mock OpenAI-compatible server with exact timing.
- :mod:`~servegym.loadgen.eventloop`: running on uvloop.

Nothing is imported here, so ``import servegym.loadgen.records`` stays light.
"""
