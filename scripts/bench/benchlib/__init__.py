"""The figures of ``scripts/bench.py``, one module each, over one shared harness."""
