"""areal_m2po: an RLHF PPO trainer for Hugging Face causal LMs with M2PO built into the actor."""

__version__ = "0.1.0"
