#!/usr/bin/env bash
# The main-job command of the README: set up the environment, then run `gcodec demo`.
# demo: torch, mpi4py + mpich, tqdm; bench: matplotlib for --plot
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh" demo,bench
exec gcodec demo "$@"
