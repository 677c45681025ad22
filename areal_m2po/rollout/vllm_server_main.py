"""``python -m areal_m2po.rollout.vllm_server_main --parent-pid PID -- <vLLM server args>``: the
stable command line of a vLLM server with the trainer's watchdog (code:
:mod:`areal_m2po.rollout.servers.vllm_main`)."""

from areal_m2po.rollout.servers.vllm_main import main

if __name__ == "__main__":
    main()
