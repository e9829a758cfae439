"""Boss device worker: reads local Codex threads and reports their context budgets to Boss."""
