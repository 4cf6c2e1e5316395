"""Highwater's benchmarks (bench/README.md): each module is a script run from the repository
root as `python bench/<name>.py`. This file makes `bench` a regular package so the scripts'
`from bench import common` and mypy resolve the same module names."""
