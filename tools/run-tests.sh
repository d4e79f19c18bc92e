#!/usr/bin/env bash
# The test command of the README: one fresh (or reused) virtual environment, lint, types, tests.
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh" test
echo "== ruff"; ruff check . && ruff format --check .
echo "== mypy"; mypy
echo "== import contract"; lint-imports --no-cache
echo "== mkdocs"; NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet --site-dir "$(mktemp -d)"
echo "== pytest"
set +e
python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi
exit "$rc"
