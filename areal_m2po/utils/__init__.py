"""Utilities with no algorithm in them: the batch layout, distributed helpers, recover
checkpoint I/O, logging and metrics, user-object loading, chunked log-probs and host memory."""
