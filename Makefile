# The two commands a newcomer needs: `make demo` and `make test`.
# TORCH=2.13.0 by default; `make test TORCH=2.4.1` installs another release first.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= 2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.gradwatch-installed

.PHONY: demo test lint typecheck install bench mutate clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first and pinned, so no range below can pull a different (CUDA, several GB) build.
	$(BIN)/pip install -q "torch==$(TORCH)"
	$(BIN)/pip install -q -e ".[torch,server,dev]"
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/gradwatch demo

test: install lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: install typecheck
	$(BIN)/ruff check .

# mypy cannot follow setuptools' editable mapping of top-level folders into the
# gradwatch namespace, so it reads them through a tree of links with the installed names.
typecheck: install
	mkdir -p build/typecheck/gradwatch
	for part in protocol trainer_hooks server integrations notebook; do ln -sfn ../../../$$part build/typecheck/gradwatch/$$part; done
	cd build/typecheck && MYPYPATH=. ../../$(BIN)/mypy --config-file ../../pyproject.toml \
		-p gradwatch.protocol -p gradwatch.trainer_hooks -p gradwatch.server \
		-p gradwatch.integrations -p gradwatch.notebook
	cd build/typecheck && MYPYPATH=. ../../$(BIN)/mypy --config-file ../../pyproject.toml \
		../../examples

bench: install
	$(BIN)/python bench/overhead.py

# Mutation testing (slow: minutes per module; never in CI). MODULES=vanishing picks by
# name; the last score and surviving mutants are in docs/TESTING.md.
mutate: install
	$(BIN)/pip install -q -e ".[mutate]"
	OMP_NUM_THREADS=1 $(BIN)/python tests/mutate/run.py $(MODULES)

clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
