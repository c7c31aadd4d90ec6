"""ServeGym: a benchmark of AI agents as LLM-serving engineers."""

__version__ = "0.1.0"
