"""Rollout servers over HTTP: one engine (:mod:`.base`: the server pool, routing by request id,
abort-and-continue, health, weight updates, errors) and thin backends for the SGLang protocol
(:mod:`.sglang`: our HF rollout server and SGLang's) and for vLLM servers (:mod:`.vllm`)."""
