"""Chat in a project conversation (CHAT-1, CHAT-3, CHAT-5..7): messages with per-conversation
sequences, sending a message to one Codex thread (the task request rides this service's outbox),
the conversation's projection of the scheduler's tasks, and retries.

- `domain.py`: pure rules (send eligibility, the task projection, the collaboration gate);
- `wording.py`: the system message of each way a task can fail;
- `repository.py`: the chat tables (messages, message_sequences, chat_tasks);
- `handlers.py`: the use cases, each one transaction with its outbox events;
- `proto_mapping.py`: chat values as protobuf messages, for the servicer.
"""
