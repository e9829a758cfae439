"""Reading Codex session (rollout) files: parsing, budget arithmetic, per-thread tracking, following."""
