"""context_budget's PostgreSQL ingest statements: the upsert replaces the whole current row with
`ROW(EXCLUDED.*)`, which is only right while the statement's column list is the table's, in table
order; and the statements run on their own stay under psycopg's query cache limit, over which
psycopg parses the statement anew on each execution. (The small-batch write rides on the outbox
append, a statement over the limit: parsing it costs ~14 us, far less than the round trip it saves.)"""

from __future__ import annotations

from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH

from services.context_budget.adapters import repository
from services.context_budget.adapters.tables import thread_contexts


def test_state_columns_are_the_current_rows_table_in_table_order() -> None:
    assert [name for name, _type in repository._STATE_COLUMNS] == [c.name for c in thread_contexts.columns]


def test_ingest_statements_fit_psycopgs_query_cache() -> None:
    statements = repository.SqlAlchemyContextRepository("postgresql")
    for name in ("_pg_batch_context", "_pg_upsert_unnest", "_pg_merge_staging"):
        assert len(getattr(statements, name).encode()) <= MAX_CACHED_STATEMENT_LENGTH, name
