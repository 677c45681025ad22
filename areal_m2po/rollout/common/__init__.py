"""What the rollout engines and the rollout servers both need, importing neither: the
per-version weight files (:mod:`.weight_files`) and the gate in front of every server with the
weights-root check (:mod:`.guard`). Engines and servers import this package; it imports only
the standard library, torch and safetensors."""
