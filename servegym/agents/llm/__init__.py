"""LLM agents: a model calls the task's tools in a loop (:mod:`~servegym.agents.llm.agent`),
with its tools (:mod:`~servegym.agents.llm.tools`) and context trimming
(:mod:`~servegym.agents.llm.context`).

The provider clients, their types, costs and fake provider servers are in
:mod:`servegym.providers`, which the judge uses too.
"""
