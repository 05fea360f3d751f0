# make demo / make test work on a fresh machine: they create .venv and install pinned versions.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.qvl-installed
# Exact versions for this machine (CPU torch that imports beside torchvision); pyproject keeps ranges.
PINS := torch==2.14.1 torchvision==0.29.1 transformers==5.15.1 typer==0.29.2 rich==15.0.0 \
        pyyaml==6.0.4 pillow==13.0.0 av==18.1.0 filelock==4.3.1 pytest==9.2.0 hypothesis==6.170.17 ruff==0.17.6 \
        accelerate==1.16.0 psutil==7.2.2 matplotlib==3.11.2 ray==2.60.0 kubernetes-validate==1.37.0 \
        pytest-xdist==3.8.0 easy-vqa==1.0
# optimum-rbln 0.12.0 pins torch 2.13 / torchvision 0.28: installed without its dependencies beside the CPU torch above
# (what it imports at run time is in PINS: accelerate, psutil), so tests and `qvl ... --emulate` run its real code.
OPTIMUM_RBLN := optimum-rbln==0.12.0

.PHONY: install demo test lint bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check $(PINS)
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps $(OPTIMUM_RBLN)
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

demo: install
	PATH=$(abspath $(BIN)):$$PATH bash scripts/demo.sh

# Two pytest-xdist workers (CI has two cores), one test file per worker at a time so a module's fixtures (a compiled
# artifact, a local Ray) are built once; about 4 min here instead of about 7 serially.
test: install
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

lint: install
	$(BIN)/ruff check qwenvl_rbln tests benchmarks scripts
	$(BIN)/ruff format --check qwenvl_rbln tests benchmarks scripts

bench: install
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) qvl-out .pytest_cache
