"""Rollout: inference engines, rollout workflows and the executors that run them.

The two interfaces live in :mod:`areal_m2po.api.engine_api` and
:mod:`areal_m2po.api.workflow_api`; this package holds their implementations:

* engines (:mod:`.engines`): Hugging Face ``generate`` in process, rollout servers over HTTP
  (one remote engine, SGLang-protocol and vLLM backends), vLLM in process;
* servers (:mod:`.servers`): the HF rollout server, the process manager of every server the
  trainer starts; what engines and servers both need (the weight files, the server gate) is
  in :mod:`.common`, which imports neither;
* workflows (:mod:`.workflows`, named by ``rollout.workflow``): single-turn RLVR, multi-turn
  episodes, agent code behind the OpenAI-compatible endpoint (:mod:`.openai`), scoring with
  :mod:`.rewards`;
* executors: :mod:`.sync_executor` (``rollout.mode=sync``, exact ``rollout.staleness``) and
  :mod:`.async_executor` (``rollout.mode=async``, ``max_head_offpolicyness``,
  :mod:`.staleness`), both running each record's episodes (:func:`.executor.arun_group`) and
  turning the groups into the trainer's batch with :mod:`.batch_builder`; :mod:`.factory`
  picks engine and executor from the config.

The module tree is drawn in docs/rollout.md.
"""
