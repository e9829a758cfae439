"""The worker package (packaging/worker/) as a node gets it: the wheel scripts/build_worker_wheel.sh
builds, installed into a fresh virtualenv that holds nothing but the wheel and the distributions it
declares (and theirs), linked from the project's virtualenv, so that this needs no package index.
Nothing of the repository is on that virtualenv's path: a worker module importing `services`, or a
dependency the package does not declare, fails here.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from boss_common.time import utc_now
from tests.conftest import REPOSITORY_ROOT
from tests.integration.worker_runtime.support import NODE_ID, WORKER_ID, ContextBudgetHarness
from worker.demo_sessions import write_demo_codex_home

DECLARED = {"grpcio", "protobuf", "googleapis-common-protos", "zstandard"}
SERVER_ONLY = ("services", "fastapi", "starlette", "sqlalchemy", "alembic", "jwt", "openai", "opentelemetry")

# Run in the installed virtualenv: server packages made unimportable even if they were there, every
# module of the package imported, then the top-level modules that got loaded printed.
IMPORT_EVERYTHING = f"""
import importlib, importlib.abc, pkgutil, sys

class RefuseServerCode(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {SERVER_ONLY!r}:
            raise ImportError(f"server code imported by the worker package: {{name}}")
        return None

sys.meta_path.insert(0, RefuseServerCode())
import boss_common, worker
for package in (worker, boss_common):
    for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        importlib.import_module(module.name)
loaded = {{name.partition(".")[0] for name in sys.modules}} - set(sys.stdlib_module_names)
print(" ".join(sorted(name for name in loaded if not name.startswith("_"))))
"""


@dataclass(frozen=True)
class InstalledWorker:
    """The built wheel and the virtualenv it is installed in."""

    wheel: Path
    venv: Path

    def run(self, *arguments: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Runs a program of the virtualenv's bin/ outside the repository, with no PYTHONPATH."""
        environment = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}
        return subprocess.run(
            [str(self.venv / "bin" / arguments[0]), *arguments[1:]],
            cwd=self.venv,
            env=environment,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def requirement_closure(names: set[str]) -> set[str]:
    """`names` and every distribution they require (markers evaluated here, no extras)."""
    seen: set[str] = set()
    pending = [canonicalize_name(name) for name in names]
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        for text in metadata.distribution(name).requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(canonicalize_name(requirement.name))
    return seen


def link_distribution(name: str, site_packages: Path) -> None:
    """Links every file of the project virtualenv's distribution `name` into `site_packages` (file
    by file: `google/` is shared by protobuf, googleapis-common-protos and others)."""
    distribution = metadata.distribution(name)
    for file in distribution.files or []:
        if file.parts[0] == ".." or "__pycache__" in file.parts:
            continue
        target = site_packages / file
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            target.symlink_to(Path(str(distribution.locate_file(file))).resolve())


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InstalledWorker]:
    root = tmp_path_factory.mktemp("worker-package")
    built = subprocess.run(
        [str(REPOSITORY_ROOT / "scripts" / "build_worker_wheel.sh"), str(root / "dist")],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        check=True,
    )
    wheel = Path(built.stdout.strip().splitlines()[-1])
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check"]
    subprocess.run([*pip, "install", "--quiet", "--no-deps", "--no-index", str(wheel)], check=True)
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    for name in requirement_closure(DECLARED):
        link_distribution(name, Path(purelib))
    yield InstalledWorker(wheel, venv)


def test_the_wheel_holds_the_worker_its_neutral_package_and_the_generated_code(
    installed: InstalledWorker,
) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = wheel.namelist()
        [metadata_name] = [name for name in names if name.endswith(".dist-info/METADATA")]
        [entry_points] = [name for name in names if name.endswith(".dist-info/entry_points.txt")]
        package_metadata = wheel.read(metadata_name).decode()
        scripts = wheel.read(entry_points).decode()

    assert installed.wheel.name == "boss_worker-0.1.0-py3-none-any.whl"
    assert {name.split("/")[0] for name in names} == {
        "worker",
        "boss_common",
        "boss",
        "boss_worker-0.1.0.dist-info",
    }
    for module in ("worker/__main__.py", "worker/local_agent/agent_loop.py", "boss_common/time.py"):
        assert module in names
    for service in ("context_budget", "conversations", "scheduler", "common"):
        assert any(name.startswith(f"boss/{service}/v1/") and name.endswith("_pb2.py") for name in names)
    requires = {
        line.split(": ", 1)[1] for line in package_metadata.splitlines() if line.startswith("Requires-Dist:")
    }
    assert {Requirement(text).name for text in requires if Requirement(text).marker is None} == DECLARED
    assert {Requirement(text).name for text in requires if Requirement(text).marker is not None} == {
        "opentelemetry-sdk",
        "opentelemetry-exporter-otlp",
    }  # the `tracing` extra
    assert "boss-worker = worker.__main__:main" in scripts


def test_the_installed_worker_imports_no_server_code(installed: InstalledWorker) -> None:
    result = installed.run("python", "-c", IMPORT_EVERYTHING)

    assert result.returncode == 0, result.stderr
    loaded = set(result.stdout.split())
    assert {"worker", "boss_common", "boss", "grpc", "google", "zstandard"} <= loaded
    assert not loaded & set(SERVER_ONLY), loaded


async def test_the_installed_boss_worker_reports_once_to_a_real_context_budget(
    installed: InstalledWorker, context_budget: ContextBudgetHarness, tmp_path: Path
) -> None:
    usage = installed.run("boss-worker", "--help")
    assert usage.returncode == 0 and usage.stdout.startswith("usage: boss-worker"), usage.stderr
    codex_home = tmp_path / "codex"
    threads = write_demo_codex_home(codex_home, utc_now(), threads=2)

    result = await asyncio.to_thread(
        installed.run,
        "boss-worker",
        "run",
        "--once",
        "--timeout",
        "15",
        "--codex-home",
        str(codex_home),
        "--context-budget-address",
        context_budget.address,
        "--token",
        context_budget.worker_token(),
        "--worker-id",
        WORKER_ID,
        "--node-id",
        NODE_ID,
    )

    assert result.returncode == 0, result.stderr
    assert "reported 2 thread(s); every snapshot acknowledged" in result.stderr
    for thread in threads:
        assert await context_budget.thread_context(thread.codex_thread_id) is not None
