"""The figures of ``scripts/bench/bench.py``, one module each, over one shared harness."""
