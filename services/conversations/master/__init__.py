"""The master agent (CHAT-2): its chat backends, the prompt that carries the system's real state, and
the model client the group chat's dispatch plans use to draft instructions and summaries."""
