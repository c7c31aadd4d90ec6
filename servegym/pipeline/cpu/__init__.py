"""The CPU track's RAG pipeline, with real parts.

- :mod:`~servegym.pipeline.cpu.corpus`: passages cut from standard-library docstrings, and
  questions whose supporting passages are known (deterministic by seed);
- :mod:`~servegym.pipeline.cpu.worker`: the retrieval worker, run with the CPU track's Python
  (all-MiniLM-L6-v2 embeddings, a FAISS HNSW index, exact re-scoring);
- :mod:`~servegym.pipeline.cpu.retrieval`: the harness's side of it (no torch, no faiss);
- :mod:`~servegym.pipeline.cpu.batcher`: concurrent questions' queries batched into worker calls;
- :mod:`~servegym.pipeline.cpu.llm`: the LLM stages' requests to OpenAI-compatible servers;
- :mod:`~servegym.pipeline.cpu.knobs`, :mod:`~servegym.pipeline.cpu.recall`: the agent's knobs,
  recall@k;
- :mod:`~servegym.pipeline.cpu.runner`: the pipeline over a question set, giving a
  :class:`~servegym.pipeline.result.PipelineResult`.

``python -m servegym.pipeline.cpu --base-url URL`` runs it once against running servers.
"""
