#!/usr/bin/env bash
# The test command of the README: one fresh (or reused) virtual environment, lint, types, tests.
# pytest-xdist workers: one more than the cores (at most 4), each test module whole on one worker
# (its module-scoped jobs run once), in the order tests/conftest.py gives them (longest first). Many tests wait on other processes (ranks, watchdogs, a
# stopped peer's timeout): with a worker per core a core idles in those waits, and one spare
# worker fills them. GCODEC_TEST_WORKERS=N sets the count; 0 runs the suite in this one process.
cores="$(nproc 2>/dev/null || echo 2)"
workers="${GCODEC_TEST_WORKERS:-$((cores + 1))}"
[ "$workers" -gt 4 ] && workers=4
xdist=()
[ "$workers" -gt 1 ] && xdist=(-n "$workers" --dist loadfile --no-loadscope-reorder)

# Numba's kernel cache, filled once before the tests, in one process per core: otherwise the
# workers (and the ranks of every multi-process test) each compile the common kernels they first
# meet at the same time. Seconds with a filled cache; minutes of CPU on a fresh clone. It starts as
# soon as NumPy and Numba are installed (tools/_venv.sh with_core), on the core that pip leaves
# idle while it installs torch and the other extras, and goes on beside the lint steps, which use
# one core. (A session in one process warms the cache in the background instead, on the core it
# leaves idle: tests/conftest.py.)
warm_log="$(mktemp)"
warm_pid=""
stop_warmup() {
    # its own process group (setsid), so that its pool processes stop too; it may have ended already
    if [ -n "$warm_pid" ]; then
        kill -- "-$warm_pid" 2>/dev/null || kill "$warm_pid" 2>/dev/null || true
        wait "$warm_pid" 2>/dev/null || true
    fi
    warm_pid=""
}
start_warmup() {
    [ "$workers" -gt 1 ] || return 0
    group=()
    command -v setsid >/dev/null && group=(setsid --wait)
    PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "${group[@]}" "$VENV/bin/python" -m gcodec warmup --jobs "$cores" \
        >"$warm_log" 2>&1 &
    warm_pid=$!
}
with_core() { start_warmup; }
core_unpinned() { stop_warmup; }
trap 'stop_warmup; rm -f "$warm_log"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh" test
[ -n "$warm_pid" ] || start_warmup
echo "== ruff"; ruff check . && ruff format --check .
echo "== mypy"; mypy
echo "== import contract"; lint-imports --no-cache
echo "== mkdocs"; NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet --site-dir "$(mktemp -d)"
if [ -n "$warm_pid" ]; then
    echo "== kernel cache"
    if ! wait "$warm_pid"; then cat "$warm_log" >&2; echo "gcodec warmup failed" >&2; exit 1; fi
    tail -n 1 "$warm_log"
    warm_pid=""
fi
# Bytecode for the project's own modules, written once: every worker, rank program, mpiexec rank and
# CLI run of the suite is a fresh interpreter that otherwise compiles gcodec's and the tests'
# sources again wherever PYTHONDONTWRITEBYTECODE is set (as on the machines CI runs on). Seconds.
python -m compileall -q -j 0 gcodec tests tools bench >/dev/null
echo "== pytest"
set +e
python -m pytest "${xdist[@]}" "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi
exit "$rc"
