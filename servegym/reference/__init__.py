"""The reference of a real-track evaluation: the task's baseline, served by the task's own
engine and model at full precision (:func:`~servegym.reference.config.reference_config`),
greedy. Its outputs (computed once, cached by everything they depend on) are what the
accuracy gate's agreement compares with (:mod:`servegym.reference.outputs`); its prompt
log-probabilities re-score the probe check's blind draw (:mod:`servegym.reference.rescore`).
"""
