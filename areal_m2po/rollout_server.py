"""``python -m areal_m2po.rollout_server``: the stable command line of the HF rollout server
(SGLang's launch flags; code: :mod:`areal_m2po.rollout.servers.hf_server_main`)."""

import sys

from areal_m2po.rollout.servers.hf_server_main import main

if __name__ == "__main__":
    sys.exit(main())
