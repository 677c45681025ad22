"""AReaL's experimental APIs (``areal.experimental`` at areal-project/AReaL cbff54d6): the
recording OpenAI client, :mod:`.openai`."""
