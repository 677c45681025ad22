"""The OpenAI-compatible chat-completions endpoint agents talk to: its server and sessions
(:mod:`.endpoint`) and the request fields it honours (:mod:`.chat_request`)."""
