"""The local agent: claims this node's chat tasks and runs them through the real Codex CLI."""
