"""Chat over REST and SSE (SPEC CHAT-3, CHAT-5, CHAT-6): the JSON shapes of messages, chat tasks and
the collaboration gate (`schemas`), and their one conversion from the conversations protos and event
payloads (`mapping`). The routes are in routers/chat.py; the SSE stream (routers/events.py) sends
the same shapes."""
