"""Outside frameworks that drive ServeGym trials (Inspect AI: :mod:`.inspect`).

An integration sits above the runner: it runs ordinary trials (``run_trial``, the trial
folder written as usual) with an agent whose decisions come from the other framework.
"""
