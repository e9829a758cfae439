#!/usr/bin/env bash
# Installs the Boss device worker on this machine (Linux or macOS), from a clone or a built wheel:
#   scripts/install_worker.sh [--wheel FILE] [--dir FOLDER]
#
#   --wheel FILE   a boss-worker wheel (`make worker-wheel` writes one into dist/); without it the
#                  wheel is built from this clone: with its .venv when `make setup` made one, else
#                  in a throwaway virtualenv holding only the pinned build tools.
#   --dir FOLDER   the install folder (default ~/.local/share/boss-worker), which gets
#                    venv/                    a virtualenv with the package and its `boss-worker`
#                    worker.env               the settings, from deploy/worker/ (kept when installing again)
#                    data/                    the credential and journal (mode 0700)
#                    boss-worker.service      the systemd user unit, for this folder
#                    com.boss.worker.plist    the launchd agent, for this folder
#   PYTHON         the interpreter of the virtualenv (default python3; 3.11 or later)
#
# The dependencies come from the package index (pip's own configuration). Prints how to enroll the
# machine and how to keep the worker running.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
default_folder=".local/share/boss-worker"
folder="$HOME/$default_folder"
wheel=""
PYTHON="${PYTHON:-python3}"

usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --wheel) wheel="${2:?--wheel needs a file}"; shift 2 ;;
    --dir) folder="${2:?--dir needs a folder}"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "install_worker: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "install_worker: $PYTHON is not Python 3.11 or later: set PYTHON to one" >&2
  exit 2
fi
mkdir -p "$folder"
folder="$(cd "$folder" && pwd)"
scratch="$(mktemp -d "${TMPDIR:-/tmp}/boss-worker-install.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT

if [ -z "$wheel" ]; then
  builder="$root/.venv/bin/python"
  if ! [ -x "$builder" ] || ! "$builder" -c 'import grpc_tools, google.rpc, setuptools' 2>/dev/null; then
    echo "==> a build virtualenv with the pinned grpcio-tools, protobuf, googleapis-common-protos, setuptools"
    "$PYTHON" -m venv "$scratch/build"
    builder="$scratch/build/bin/python"
    pins=$(grep -hE '^(grpcio-tools|protobuf|googleapis-common-protos|setuptools)==' \
      "$root/requirements.txt" "$root/requirements-dev.txt")
    # shellcheck disable=SC2086  # one pin a word
    "$builder" -m pip install --quiet $pins
  fi
  echo "==> building the worker's wheel from $root"
  wheel=$(PYTHON="$builder" "$root/scripts/build_worker_wheel.sh" "$scratch/dist")
fi
[ -f "$wheel" ] || { echo "install_worker: no wheel at $wheel" >&2; exit 2; }

echo "==> installing $(basename "$wheel") and its dependencies into $folder/venv"
[ -x "$folder/venv/bin/python" ] || "$PYTHON" -m venv "$folder/venv"
"$folder/venv/bin/python" -m pip uninstall --quiet --yes boss-worker >/dev/null 2>&1 || true
"$folder/venv/bin/python" -m pip install --quiet --disable-pip-version-check "$wheel"

mkdir -p "$folder/data" && chmod 700 "$folder/data"
if [ -f "$folder/worker.env" ]; then
  echo "==> keeping your settings in $folder/worker.env"
else
  codex_line="#BOSS_WORKER_CODEX_BIN=/usr/local/bin/codex"
  if codex=$(command -v codex); then codex_line="BOSS_WORKER_CODEX_BIN=$codex"; fi
  sed -e "s|@DATA_DIR@|$folder/data|" -e "s|^#BOSS_WORKER_CODEX_BIN=.*|$codex_line|" \
    "$root/deploy/worker/worker.env" >"$folder/worker.env"
  chmod 600 "$folder/worker.env"
fi
# The service definitions name the default folder; these copies name this one.
sed "s|%h/$default_folder|$folder|g" "$root/deploy/worker/boss-worker.service" >"$folder/boss-worker.service"
sed "s|\$HOME/$default_folder|$folder|g" "$root/deploy/worker/com.boss.worker.plist" >"$folder/com.boss.worker.plist"

boss_worker="$folder/venv/bin/boss-worker"
"$boss_worker" --help >/dev/null
cat <<EOF

Installed: $boss_worker

1. Edit $folder/worker.env: the addresses of your Boss deployment's services and, when they are on
   another machine, TLS (BOSS_GRPC_TLS=true, or BOSS_TLS_CA_FILE for your own CA): the worker
   refuses to send its credential there in plaintext unless BOSS_WORKER_ALLOW_PLAINTEXT=true.
2. Enroll this machine with a one-time pairing code from its owner (the console's Devices page, or
   \`python -m services.bff_gateway pairing-code --owner OWNER\` on the server):
     (set -a; . "$folder/worker.env"; set +a; "$boss_worker" enroll CODE)
3. Keep the worker running:
EOF
if [ "$(uname -s)" = Darwin ]; then
  cat <<EOF
     cp "$folder/com.boss.worker.plist" ~/Library/LaunchAgents/
     launchctl bootstrap gui/\$(id -u) ~/Library/LaunchAgents/com.boss.worker.plist
   Its log: ~/Library/Logs/boss-worker.log
EOF
else
  cat <<EOF
     mkdir -p ~/.config/systemd/user && cp "$folder/boss-worker.service" ~/.config/systemd/user/
     systemctl --user daemon-reload && systemctl --user enable --now boss-worker
   Its log: journalctl --user -u boss-worker -f (loginctl enable-linger "\$USER" keeps it running
   while you are logged out)
EOF
fi
