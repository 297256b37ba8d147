# Every target sets itself up: it creates or refreshes its virtual environment from the pinned
# requirement files and rebuilds recops incrementally before running.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.requirements-installed
# The oldest supported torch, in a venv and a copy of the tree of its own (test-compat).
COMPAT_VENV := .venv-compat
COMPAT_PY := $(abspath $(COMPAT_VENV))/bin/python
COMPAT_STAMP := $(COMPAT_VENV)/.requirements-installed
COMPAT_TREE := build/compat
# torchrec next to the pinned torch and fbgemm-gpu-cpu (requirements-torchrec.txt, docs/torchrec.md).
TORCHREC_VENV := .venv-torchrec
TORCHREC_PY := $(TORCHREC_VENV)/bin/python
TORCHREC_STAMP := $(TORCHREC_VENV)/.requirements-installed
JOBS := MAX_JOBS=$${MAX_JOBS:-2}

.PHONY: setup setup-torchrec build train test test-compat test-torchrec wheel bench format format-check clean

$(STAMP): requirements.txt requirements-data.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -r requirements-data.txt
	touch $(STAMP)

$(COMPAT_STAMP): requirements-compat.txt requirements-data.txt
	test -x $(COMPAT_PY) || python3 -m venv $(COMPAT_VENV)
	$(COMPAT_PY) -m pip install --quiet -r requirements-compat.txt
	$(COMPAT_PY) -m pip install --quiet --no-deps -r requirements-data.txt
	touch $(COMPAT_STAMP)

$(TORCHREC_STAMP): requirements.txt requirements-data.txt requirements-torchrec.txt
	test -x $(TORCHREC_PY) || python3 -m venv $(TORCHREC_VENV)
	$(TORCHREC_PY) -m pip install --quiet -r requirements.txt
	$(TORCHREC_PY) -m pip install --quiet --no-deps -r requirements-data.txt
	$(TORCHREC_PY) -m pip install --quiet --no-deps -r requirements-torchrec.txt
	touch $(TORCHREC_STAMP)

setup: $(STAMP)

setup-torchrec: $(TORCHREC_STAMP)

build: setup
	$(JOBS) $(PY) setup.py --quiet build_ext --inplace

# The main job: HSTU trained and evaluated on MovieLens-100K with recops' ops (docs/training.md);
# prints the metrics and the speed-up over the plain-PyTorch backend, writes train-results/.
train: build
	$(PY) -m recops.train --model hstu --data ml-100k --out train-results

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

# recops built against the oldest supported torch (requirements-compat.txt) and its suite run
# without FBGEMM. It builds in a copy of the tree, whose recops/_C*.so would otherwise replace the
# pinned environment's; the copy keeps its build folder, so rebuilds are incremental.
test-compat: $(COMPAT_STAMP)
	mkdir -p $(COMPAT_TREE)
	find $(COMPAT_TREE) -mindepth 1 -maxdepth 1 ! -name build -exec rm -rf {} +
	git ls-files -co --exclude-standard | tar -cf - -T - | tar -xf - -C $(COMPAT_TREE)
	cd $(COMPAT_TREE) && $(JOBS) $(COMPAT_PY) setup.py --quiet build_ext --inplace
	cd $(COMPAT_TREE) && RECOPS_HIDE_FBGEMM=1 $(COMPAT_PY) -m pytest -q tests

# recops inside torchrec: the plug-in and sharded training over 1, 2 and 4 local processes
# (tests/test_torchrec*.py; they skip where torchrec is absent, as in .venv). Same torch as .venv,
# so the in-place build serves both environments.
test-torchrec: build $(TORCHREC_STAMP)
	$(TORCHREC_PY) -m pytest -q tests/test_torchrec.py tests/test_torchrec_sharded.py tests/test_docs.py -k torchrec

# An installable wheel in dist/, requiring the torch release it was built against.
wheel: build
	$(PY) -m build --wheel --no-isolation --outdir dist

bench: build
	$(PY) benchmarks/run.py

clean:
	rm -rf build dist recops/*.so
