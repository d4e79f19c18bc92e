# Sourced by the run-*.sh scripts: create or reuse .venv and install gcodec with the given extras.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${GCODEC_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[$1]" 2>&1 \
    | grep -v -e "is ignored: it is neither a file nor a directory" || true
# pip's exit status is lost in the pipe above; check the install really happened.
"$VENV/bin/python" -c "import gcodec" || { echo "gcodec failed to install" >&2; exit 1; }
export PATH="$VENV/bin:$PATH"
