"""The worker package's definition (packaging/worker/pyproject.toml) and its service definitions
(deploy/worker/): pins as in requirements.txt, every import of the worker and boss_common covered by
a declared dependency (function-level imports included), and a systemd unit, a launchd agent and a
settings file that agree with the install layout of scripts/install_worker.sh. Building and running
the wheel itself: tests/integration/worker_runtime/test_installed_package.py."""

from __future__ import annotations

import ast
import configparser
import plistlib
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from worker.agent import LOCAL_AGENT_STOP_TIMEOUT_S
from worker.settings import DEFAULT_FLUSH_TIMEOUT_S

ROOT = Path(__file__).resolve().parents[3]
PROJECT = tomllib.loads((ROOT / "packaging" / "worker" / "pyproject.toml").read_text())["project"]
DEPLOY = ROOT / "deploy" / "worker"
OWN_PACKAGES = {"worker", "boss_common", "boss"}
INSTALL_FOLDER = ".local/share/boss-worker"
STOP_SECONDS = LOCAL_AGENT_STOP_TIMEOUT_S + DEFAULT_FLUSH_TIMEOUT_S


def declared() -> dict[str, Requirement]:
    """The package's dependencies and those of its extras (`tracing`: OpenTelemetry, imported only
    when a node traces, boss_common/tracing.py)."""
    extras = [text for texts in PROJECT.get("optional-dependencies", {}).values() for text in texts]
    return {
        canonicalize_name(Requirement(text).name): Requirement(text)
        for text in [*PROJECT["dependencies"], *extras]
    }


def imported_modules(package: str) -> dict[str, str]:
    """Top-level module -> one file importing it, for every import statement under `package`."""
    found: dict[str, str] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.partition(".")[0], str(path.relative_to(ROOT)))
    return found


def test_the_package_is_named_versioned_and_started_as_boss_worker() -> None:
    assert (PROJECT["name"], PROJECT["version"]) == ("boss-worker", "0.1.0")
    assert PROJECT["scripts"] == {"boss-worker": "worker.__main__:main"}


def test_only_the_tracing_extra_adds_opentelemetry() -> None:
    assert {canonicalize_name(Requirement(text).name) for text in PROJECT["dependencies"]} == {
        "grpcio",
        "protobuf",
        "googleapis-common-protos",
        "zstandard",
    }
    assert {
        extra: {canonicalize_name(Requirement(text).name) for text in texts}
        for extra, texts in PROJECT["optional-dependencies"].items()
    } == {"tracing": {"opentelemetry-sdk", "opentelemetry-exporter-otlp"}}


def test_dependencies_are_pinned_as_in_requirements_txt() -> None:
    pinned = {
        canonicalize_name(Requirement(line).name): Requirement(line)
        for line in (ROOT / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }

    for name, requirement in declared().items():
        assert str(requirement.specifier).startswith("=="), requirement
        assert requirement.specifier == pinned[name].specifier, (requirement, pinned[name])


def test_every_import_of_the_worker_and_boss_common_is_stdlib_its_own_or_declared() -> None:
    provided = {
        module
        for module, distributions in metadata.packages_distributions().items()
        if {canonicalize_name(name) for name in distributions} & set(declared())
    }
    imports = {**imported_modules("boss_common"), **imported_modules("worker")}

    undeclared = {
        module: where
        for module, where in imports.items()
        if module not in sys.stdlib_module_names and module not in OWN_PACKAGES and module not in provided
    }
    assert undeclared == {}


def test_the_systemd_unit_runs_the_installed_boss_worker_and_restarts_it_on_failure() -> None:
    unit = configparser.ConfigParser(interpolation=None, strict=True)
    unit.optionxform = str  # type: ignore[assignment,method-assign]  # systemd keys are case-sensitive
    unit.read_string((DEPLOY / "boss-worker.service").read_text())
    service = unit["Service"]

    assert service["ExecStart"] == f"%h/{INSTALL_FOLDER}/venv/bin/boss-worker run"
    assert service["EnvironmentFile"] == f"%h/{INSTALL_FOLDER}/worker.env"
    assert service["Restart"] == "on-failure"
    assert service["RestartPreventExitStatus"] == "2"  # a configuration error (worker/__main__.py)
    assert service["KillMode"] == "mixed"  # SIGTERM to the worker, which stops its Codex turns
    assert float(service["TimeoutStopSec"]) >= STOP_SECONDS
    assert unit["Install"]["WantedBy"] == "default.target"
    assert unit["Unit"]["Description"]


def test_the_launchd_agent_runs_the_installed_boss_worker_with_the_settings_file() -> None:
    with (DEPLOY / "com.boss.worker.plist").open("rb") as stream:
        agent = plistlib.load(stream)

    assert agent["Label"] == "com.boss.worker"
    shell, option, command = agent["ProgramArguments"]
    assert (shell, option) == ("/bin/sh", "-c")
    assert f'cd "$HOME/{INSTALL_FOLDER}" && set -a && . ./worker.env && set +a && ' in command
    assert f'exec "$HOME/{INSTALL_FOLDER}/venv/bin/boss-worker" run ' in command
    assert agent["RunAtLoad"] is True
    assert agent["KeepAlive"] == {"SuccessfulExit": False}
    assert agent["ExitTimeOut"] >= STOP_SECONDS


def test_the_settings_file_names_the_deployments_addresses_the_data_folder_and_the_transport() -> None:
    lines = (DEPLOY / "worker.env").read_text().splitlines()
    settings = dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))

    assert set(settings) == {
        "BOSS_CONTEXT_BUDGET_ADDRESS",
        "BOSS_SCHEDULER_ADDRESS",
        "BOSS_CONVERSATIONS_ADDRESS",
        "BOSS_DATA_DIR",
    }
    assert settings["BOSS_DATA_DIR"] == "@DATA_DIR@"  # filled in by scripts/install_worker.sh
    assert all(" " not in value and '"' not in value for value in settings.values())
    # the line the installer sets to the codex it finds on PATH
    assert sum(line.startswith("#BOSS_WORKER_CODEX_BIN=") for line in lines) == 1
    # the transport settings a remote deployment needs, one of them to uncomment
    for variable in ("BOSS_GRPC_TLS", "BOSS_TLS_CA_FILE", "BOSS_WORKER_ALLOW_PLAINTEXT"):
        assert sum(line.startswith(f"#{variable}=") for line in lines) == 1, variable
