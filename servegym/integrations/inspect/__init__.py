"""ServeGym tasks in Inspect AI (``pip install 'servegym[inspect]'``).

The ``inspect_ai`` entry point ``servegym`` (:mod:`.registry`) registers every shipped task
as ``servegym/<task-id>`` (:mod:`.catalog`) and any task by id or path as
``servegym/trial -T task=...`` (:mod:`.tasks`); an Inspect sample is one ServeGym trial
(:mod:`.session`). Only :mod:`.session` and :mod:`.generate` import without Inspect.
"""
