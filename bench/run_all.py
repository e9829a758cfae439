"""Entry point of `make bench`: runs every benchmark module present, one after the other.

Modules, in order: bench.ingest_bench, bench.scheduler_bench, bench.conversations_bench,
bench.chat_bench, bench.tasks_bench, bench.plan_bench, bench.group_bench, bench.retention_bench. A
module that does not exist (yet) is skipped and said so; one without a `main()` is reported as
broken. Each `main()` takes no arguments and returns an exit code (None counts as 0). Each module
writes its own JSON under bench/output/; this prints where the results went and exits with the
worst code (0 when every module present succeeded). The analysis of all of them lives in one file,
bench/RESULTS.md (sections Ingest, Scheduler, Conversations, Chat turn, Tasks and leases, Group
chat, Retention).

Run: `make bench` or `PYTHONPATH=.:gen .venv/bin/python -m bench.run_all`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import time
import traceback
from pathlib import Path

MODULES = (
    "bench.ingest_bench",
    "bench.scheduler_bench",
    "bench.conversations_bench",
    "bench.chat_bench",
    "bench.tasks_bench",
    "bench.plan_bench",
    "bench.group_bench",
    "bench.retention_bench",
)
OUTPUT_DIR = Path(__file__).resolve().parent / "output"


def run_module(name: str) -> int | None:
    """Runs `name.main()`; returns its exit code, or None when the module is absent. A crash or a
    module without `main` counts as exit code 2."""
    if importlib.util.find_spec(name) is None:
        return None
    try:
        module = importlib.import_module(name)
        entry = getattr(module, "main", None)
        if not callable(entry):
            sys.stderr.write(f"{name}: no main() to run\n")
            return 2
        code = entry()
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 2)
    except Exception:
        traceback.print_exc()
        return 2
    return int(code or 0)


def main() -> int:
    """Runs every benchmark present; prints a line per module and the files under bench/output/."""
    outcomes: dict[str, str] = {}
    worst = 0
    for name in MODULES:
        sys.stdout.write(f"==> {name}\n")
        sys.stdout.flush()
        started = time.perf_counter()
        code = run_module(name)
        if code is None:
            outcomes[name] = "not present, skipped"
            continue
        outcomes[name] = f"exit {code} in {time.perf_counter() - started:.0f} s"
        worst = max(worst, code)
    sys.stdout.write("\n==> summary\n")
    for name, outcome in outcomes.items():
        sys.stdout.write(f"  {name}: {outcome}\n")
    results = sorted(OUTPUT_DIR.glob("*.json")) if OUTPUT_DIR.exists() else []
    sys.stdout.write("results (machine-readable):\n")
    for path in results:
        sys.stdout.write(f"  {path.relative_to(OUTPUT_DIR.parent.parent)}\n")
    sys.stdout.write("analysis and history: bench/RESULTS.md; how to run: bench/README.md\n")
    return worst


if __name__ == "__main__":
    sys.exit(main())
