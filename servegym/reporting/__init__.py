"""Above the runner: what is made of finished trials (leaderboards, the HTML report, the
server figures, the LLM judge)."""
