#!/usr/bin/env bash
# Generates Python code for every contract under protos/boss into gen/ (never edited by hand).
# google/rpc protos come from the googleapis-common-protos wheel; they are also copied into
# protos/third_party/googleapis so that `buf lint` can resolve them offline.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
site_packages=$("$PYTHON" -c 'import os; from google.rpc import status_pb2; print(os.path.dirname(os.path.dirname(os.path.dirname(status_pb2.__file__))))')
vendored=protos/third_party/googleapis/google/rpc
mkdir -p "$vendored"
cp "$site_packages"/google/rpc/{status,code,error_details}.proto "$vendored"/
rm -rf gen && mkdir -p gen
mapfile -t files < <(find protos/boss -name '*.proto' | sort)
"$PYTHON" -m grpc_tools.protoc -Iprotos -I"$site_packages" \
  --python_out=gen --pyi_out=gen --grpc_python_out=gen "${files[@]}"
echo "generated ${#files[@]} contract files into gen/"
