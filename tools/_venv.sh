# Sourced by the run-*.sh scripts: create or reuse .venv and install gcodec with the given extras.
#
# A caller that defines a shell function `with_core` has it run as soon as gcodec's own
# dependencies (NumPy, Numba, ml_dtypes, crc32c) are installed, before gcodec and the extras (torch
# and the rest: minutes, mostly on one core), so that it can start work that needs only the core
# meanwhile, such as filling Numba's kernel cache (with PYTHONPATH=$ROOT: gcodec from the source
# tree, which the install does not touch). The extras are then installed with the core packages
# pinned to the versions that work is using; where the extras need other versions,
# `core_unpinned` (if defined) is called first, to stop that work, and they are installed unpinned.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${GCODEC_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
_pip() {
    local log rc=0
    log="$(mktemp)"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" >"$log" 2>&1 || rc=$?
    grep -v -e "is ignored: it is neither a file nor a directory" "$log" || true
    rm -f "$log"
    return "$rc"
}
if declare -F with_core >/dev/null; then
    core=()
    read -r -a core < <("$VENV/bin/python" -c "
import tomllib
print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))")
    _pip "${core[@]}" || { echo "installing gcodec's core dependencies failed" >&2; exit 1; }
    with_core
    pins=()
    read -r -a pins < <("$VENV/bin/python" -c "
import importlib.metadata as m
print(' '.join(f'{p}=={m.version(p)}' for p in ('numpy', 'numba', 'llvmlite', 'ml_dtypes', 'crc32c')))")
    if ! _pip -e ".[$1]" "${pins[@]}"; then
        echo "the extras need other versions of ${pins[*]}: installing them unpinned" >&2
        if declare -F core_unpinned >/dev/null; then core_unpinned; fi
        _pip -e ".[$1]" || true
    fi
else
    _pip -e ".[$1]" || true
fi
# pip's failures are not fatal above (an extra that cannot install shows in the tests that need
# it); check that gcodec itself installed.
"$VENV/bin/python" -c "import gcodec" || { echo "gcodec failed to install" >&2; exit 1; }
export PATH="$VENV/bin:$PATH"
