#!/bin/sh
# The image's entry point: the first argument picks what runs.
#
#   controller | broker | gateway   one service process (the same `python -m
#                                   services` LocalCluster starts, so a container
#                                   runs exactly what the integration tests run)
#   anything else                   the `highwater` command line (topics, cluster
#                                   status, ...)
set -eu

case "${1:-}" in
  controller|broker|gateway)
    exec python -m services "$@"
    ;;
  *)
    exec highwater "$@"
    ;;
esac
