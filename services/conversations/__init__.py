"""The conversations bounded context: projects (the app's conversation list), thread metadata and
registration, membership, pinning, messages, and the client-facing projection of every thread's
context budget, kept up to date from context_budget's and the scheduler's event streams."""
