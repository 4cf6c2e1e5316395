# Shortcuts; ./dev is the entry point (it creates .venv and installs etcd).
PY := .venv/bin/python
SEEDS ?= 200

.PHONY: setup demo test unit integration protos lint sim
setup:
	./dev setup
demo:
	./dev demo
test:
	./dev test
unit:
	./dev test tests/unit
integration:
	./dev test -m integration
protos:
	$(PY) scripts/gen_protos.py
lint:
	.venv/bin/ruff check .
sim:
	./dev test tests/sim --sim-seeds=$(SEEDS)
