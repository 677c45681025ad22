"""AReaL's OpenAI-client agents (``areal.workflow.openai``)."""
