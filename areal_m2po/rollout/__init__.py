"""Rollout: inference engines, rollout workflows and the executors that run them.

The two interfaces live in :mod:`areal_m2po.api.engine_api` and
:mod:`areal_m2po.api.workflow_api`; this package holds their implementations:

* engines: :mod:`.hf_engine` (in-process Hugging Face ``generate``) and :mod:`.remote_engine`
  (SGLang-protocol rollout servers over HTTP);
* workflows: :mod:`.rlvr` (single-turn generate-and-score), named by ``rollout.workflow``
  (:mod:`.workflows`), scoring with :mod:`.rewards`;
* executors: :mod:`.sync_executor` (``rollout.mode=sync``, exact ``rollout.staleness``) and
  :mod:`.async_executor` (``rollout.mode=async``, ``max_head_offpolicyness``), both turning
  groups into the trainer's batch with :mod:`.batch`; :mod:`.factory` picks them from the config.
"""
