#!/usr/bin/env bash
# Generates Python code for every contract under protos/boss into gen/ (never edited by hand), or
# into GEN_DIR when set (scripts/build_worker_wheel.sh generates into its staging folder).
# google/rpc protos come from the googleapis-common-protos wheel; they are also copied into
# protos/third_party/googleapis so that `buf lint` can resolve them offline.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
site_packages=$("$PYTHON" -c 'import os; from google.rpc import status_pb2; print(os.path.dirname(os.path.dirname(os.path.dirname(status_pb2.__file__))))')
vendored=protos/third_party/googleapis/google/rpc
mkdir -p "$vendored"
cp "$site_packages"/google/rpc/{status,code,error_details}.proto "$vendored"/
out="${GEN_DIR:-gen}"
rm -rf "$out" && mkdir -p "$out"
files=()  # (no mapfile: macOS's bash 3.2 runs this too, from scripts/install_worker.sh)
while IFS= read -r file; do files+=("$file"); done < <(find protos/boss -name '*.proto' | sort)
"$PYTHON" -m grpc_tools.protoc -Iprotos -I"$site_packages" \
  --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" "${files[@]}"
echo "generated ${#files[@]} contract files into $out/"
