#!/usr/bin/env bash
# The main-job command of the README: set up the environment, then run `gcodec demo`.
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh" test
exec gcodec demo "$@"
