"""vLLM pieces: the in-process engine, vLLM's import and environment, weight hand-over (the
tied head) and the worker extension vLLM servers load."""
