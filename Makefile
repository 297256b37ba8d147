# Every target sets itself up: it creates or refreshes .venv from requirements.txt and rebuilds
# recops incrementally before running.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.requirements-installed

.PHONY: setup build test bench format format-check clean

$(STAMP): requirements.txt requirements-data.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -r requirements-data.txt
	touch $(STAMP)

setup: $(STAMP)

build: setup
	MAX_JOBS=$${MAX_JOBS:-2} $(PY) setup.py --quiet build_ext --inplace

format-check: setup
	$(VENV)/bin/ruff check recops tests benchmarks setup.py
	$(VENV)/bin/ruff format --check recops tests benchmarks setup.py
	clang-format --dry-run --Werror $$(find csrc -name '*.h' -o -name '*.cpp' -o -name '*.cu')

format: setup
	$(VENV)/bin/ruff check --fix recops tests benchmarks setup.py
	$(VENV)/bin/ruff format recops tests benchmarks setup.py
	clang-format -i $$(find csrc -name '*.h' -o -name '*.cpp' -o -name '*.cu')

test: build format-check
	$(PY) -m pytest -q tests

bench: build
	$(PY) benchmarks/run.py

clean:
	rm -rf build recops/*.so
