"""The REST gateway (backend-for-frontend) of Boss: FastAPI over the gRPC services.

Stateless: it verifies bearer tokens, validates JSON, calls context_budget (later also scheduler
and conversations) over gRPC with the caller's token, and maps answers and gRPC errors to JSON and
application/problem+json. `python -m services.bff_gateway serve` runs it; `... token` prints tokens.
"""
