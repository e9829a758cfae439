#!/usr/bin/env bash
# Installs the real Codex CLI (npm @openai/codex at a pinned version) into a project-local folder,
# the way `make browser` installs Chromium: the tests and `make run` drive this binary.
#
#   scripts/install_codex.sh VERSION [DIR]      (DIR defaults to .tools/codex)
#
# Idempotent: when DIR already holds that version and its native binary answers --version, it
# prints so and does nothing (no network). Fails loudly when npm is missing or the install fails.
set -euo pipefail
cd "$(dirname "$0")/.."

version="${1:?usage: scripts/install_codex.sh VERSION [DIR]}"
dir="${2:-.tools/codex}"

installed_version() {
  # The native binary's "codex-cli 0.169.0" -> "0.169.0"; empty when it is missing or does not run.
  # (Asking the native binary, not the npm wrapper, needs no Node.js and saves its start-up.)
  local native
  for native in "$dir"/node_modules/@openai/codex-*/vendor/*/bin/codex "$dir"/node_modules/@openai/codex-*/vendor/*/bin/codex.exe; do
    if [ -x "$native" ]; then
      "$native" --version 2>/dev/null | awk '{print $NF}' || true
      return 0
    fi
  done
}

current="$(installed_version)"
if [ "$current" = "$version" ]; then
  echo "==> Codex CLI $version already installed in $dir"
  exit 0
fi

if ! command -v npm >/dev/null 2>&1; then
  echo "error: npm is not installed, and it is needed to install the Codex CLI $version into $dir." >&2
  echo "       Install Node.js 18 or newer with npm (e.g. 'apt-get install nodejs npm' or https://nodejs.org)," >&2
  echo "       then run 'make codex' again. Or set BOSS_CODEX_BIN to a Codex binary you already have." >&2
  exit 1
fi

if [ -n "$current" ]; then
  echo "==> replacing Codex CLI $current in $dir with $version"
else
  echo "==> installing Codex CLI $version (npm @openai/codex) into $dir"
fi
mkdir -p "$dir"
if ! npm install --prefix "$dir" --no-audit --no-fund --save-exact --loglevel=error "@openai/codex@$version"; then
  echo "error: 'npm install @openai/codex@$version' failed (see npm's message above; is the registry reachable?)." >&2
  exit 1
fi

current="$(installed_version)"
if [ "$current" != "$version" ]; then
  echo "error: after installing, the native Codex binary in $dir reports version '${current:-nothing}', not $version" >&2
  echo "       (npm may have skipped the platform package @openai/codex-<os>-<arch>; try 'rm -rf $dir')." >&2
  exit 1
fi
echo "==> Codex CLI $version installed in $dir"
