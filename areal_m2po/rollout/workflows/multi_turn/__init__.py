"""The multi-turn workflow (``rollout.workflow=multi_turn``): episodes as exact token
sequences, chat-template turns, environments (a calculator tool, a retry verifier) and their
greedy evaluation."""
