#!/usr/bin/env bash
# The test command of the README: one fresh (or reused) virtual environment, lint, types, tests.
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh" test
echo "== ruff"; ruff check . && ruff format --check .
echo "== mypy"; mypy
echo "== import contract"; lint-imports --no-cache
echo "== mkdocs"; NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet --site-dir "$(mktemp -d)"
echo "== pytest"
# pytest-xdist: one worker per core (at most 4), each test module whole on one worker (its
# module-scoped jobs run once); GCODEC_TEST_WORKERS=0 runs the suite in this one process.
workers="${GCODEC_TEST_WORKERS:-$(nproc 2>/dev/null || echo 2)}"
[ "$workers" -gt 4 ] && workers=4
xdist=()
[ "$workers" -gt 1 ] && xdist=(-n "$workers" --dist loadfile)
# Numba's kernel cache, filled once before the tests, in one process per core: otherwise the
# workers (and the ranks of every multi-process test) each compile the common kernels they first
# meet at the same time. Seconds with a filled cache; minutes of CPU on a fresh clone. (A session
# in one process warms the cache in the background instead, on the core it leaves idle: conftest.py.)
if [ "$workers" -gt 1 ]; then
    echo "== kernel cache"
    python -m gcodec warmup --jobs "$workers" | tail -n 1
fi
set +e
python -m pytest "${xdist[@]}" "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi
exit "$rc"
