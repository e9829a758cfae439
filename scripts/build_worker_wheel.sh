#!/usr/bin/env bash
# Builds the worker package's wheel (packaging/worker/pyproject.toml) into OUT_DIR (default dist/):
#   scripts/build_worker_wheel.sh [OUT_DIR]          (`make worker-wheel`)
# It stages packaging/worker/, worker/, boss_common/ and gRPC code generated afresh from protos/
# (never the working tree's gen/, which may be stale) in a temporary folder and builds there
# with `pip wheel --no-build-isolation`. PYTHON (default .venv/bin/python) needs grpcio-tools,
# googleapis-common-protos and setuptools, as requirements-dev.txt pins them. Prints the wheel's path.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-$root/.venv/bin/python}"
out="${1:-$root/dist}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
stage="$(mktemp -d "${TMPDIR:-/tmp}/boss-worker-build.XXXXXX")"
trap 'rm -rf "$stage"' EXIT

cp "$root/packaging/worker/pyproject.toml" "$root/packaging/worker/README.md" "$stage/"
for package in worker boss_common; do
  # The package's sources only (no __pycache__ or other leftovers of the working tree).
  (cd "$root" && find "$package" -name '*.py' -not -path '*/__pycache__/*') | while IFS= read -r file; do
    mkdir -p "$stage/$(dirname "$file")"
    cp "$root/$file" "$stage/$file"
  done
done
GEN_DIR="$stage/generated" PYTHON="$PYTHON" "$root/scripts/generate_protos.sh" >/dev/null
mv "$stage/generated/boss" "$stage/boss"
rm -rf "$stage/generated"

rm -f "$out"/boss_worker-*.whl
"$PYTHON" -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$out" "$stage" >&2
ls "$out"/boss_worker-*.whl
