"""Benchmarks of the Performance budgets in ARCHITECTURE.md, run against PostgreSQL by `make bench`.

Each module has a `main(argv) -> int`; `bench.run_all` runs every one present. Results go to
bench/output/ (gitignored); the analysis lives in bench/RESULTS.md.
"""
