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
# Arguments that make a venv's python print its site-packages folder.
PRINT_SITE_PACKAGES := -c 'import sysconfig; print(sysconfig.get_path("platlib"))'
# MLPerf LoadGen in the main venv, for bench-serving (requirements-serving.txt).
SERVING_STAMP := $(VENV)/.serving-requirements-installed
# recops built with AddressSanitizer + UndefinedBehaviorSanitizer (test-asan), in a tree of its own.
ASAN_TREE := build/asan
# Every kernel family's tests and the bad-input suites; the model / training / compile / packaging
# tests add no kernel code of their own and would take most of the time under the sanitizers.
ASAN_TESTS := tests/test_jagged.py tests/test_cumsum.py tests/test_sparse.py tests/test_gather.py \
	tests/test_permute_pooled.py tests/test_block_bucketize.py tests/test_embedding.py tests/test_hstu_attention.py \
	tests/test_fuxi_attention.py tests/test_relative_bias.py tests/test_deberta.py \
	tests/test_fbgemm_binding.py tests/test_bad_input.py tests/test_bad_input_properties.py \
	tests/test_segment_sum.py tests/test_jagged_index_select.py tests/test_jagged_unique_indices.py \
	tests/test_permute_sparse_features.py tests/test_keyed.py tests/test_index_select.py \
	tests/test_hashing.py tests/test_quantize.py tests/test_embedding_counter.py tests/test_bounds_check.py \
	tests/test_int_nbit_lookup.py tests/test_int_nbit_module.py tests/test_delta_attention.py \
	tests/test_layer.py tests/test_loss.py tests/test_retrieval.py
JOBS := MAX_JOBS=$${MAX_JOBS:-2}
# The C++ tests' CMake build (tests/cpp).
CPP_TEST_BUILD := build/cpp

.PHONY: setup setup-cpp setup-torchrec build train test test-cpp check-kernel-wall test-compat test-asan \
	test-torchrec wheel bench bench-serving bench-torchrec format format-check clean

# A copy of the checkout's files (tracked and untracked, not ignored) in $(1), keeping $(1)/build,
# for targets that build recops differently: their recops/_C*.so would otherwise replace the
# main build's; the kept build folder makes their rebuilds incremental.
define copy_tree
	mkdir -p $(1)
	find $(1) -mindepth 1 -maxdepth 1 ! -name build -exec rm -rf {} +
	git ls-files -co --exclude-standard | tar -cf - -T - | tar -xf - -C $(1)
endef

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

# .venv-torchrec holds torchrec and its pure-Python needs only; a .pth file puts .venv's packages
# (the pinned torch and FBGEMM, the data and test tools) on its path after its own, so the two
# environments share one install of torch instead of each unpacking 5 GB of it.
$(TORCHREC_STAMP): $(STAMP) requirements-torchrec.txt
	test -x $(TORCHREC_PY) || python3 -m venv $(TORCHREC_VENV)
	$(PY) $(PRINT_SITE_PACKAGES) > "$$($(TORCHREC_PY) $(PRINT_SITE_PACKAGES))/recops_main_venv.pth"
	$(TORCHREC_PY) -m pip install --quiet --no-deps -r requirements-torchrec.txt
	touch $(TORCHREC_STAMP)

$(SERVING_STAMP): $(STAMP) requirements-serving.txt
	$(PY) -m pip install --quiet -r requirements-serving.txt
	touch $(SERVING_STAMP)

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
	clang-format --dry-run --Werror $$(find csrc tests/cpp tests/cpp_dispatch examples -name '*.h' -o -name '*.cpp' -o -name '*.cu')

format: setup
	$(VENV)/bin/ruff check --fix recops tests benchmarks setup.py
	$(VENV)/bin/ruff format recops tests benchmarks setup.py
	clang-format -i $$(find csrc tests/cpp tests/cpp_dispatch examples -name '*.h' -o -name '*.cpp' -o -name '*.cu')

# The kernel wall, the C++ tests, then the Python suite.
test: build format-check check-kernel-wall test-cpp
	$(PY) -m pytest -q tests

# Fails when a file under csrc/recops/*/kernels, or a recops header one reaches, includes ATen,
# torch or c10 (tests/cpp/check_kernel_wall.py).
check-kernel-wall: setup
	$(PY) tests/cpp/check_kernel_wall.py

# The torch-free kernels' GoogleTest suite (tests/cpp). CMake and GoogleTest are Debian packages
# (requirements-debian.txt), installed here with apt-get where missing and this user may.
setup-cpp:
	@dpkg -s $$(cat requirements-debian.txt) >/dev/null 2>&1 || \
		{ [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y --no-install-recommends \
			$$(cat requirements-debian.txt); } || \
		{ echo "make test-cpp needs Debian's $$(cat requirements-debian.txt | xargs)"; exit 1; }

test-cpp: setup-cpp
	cmake -S tests/cpp -B $(CPP_TEST_BUILD) -DCMAKE_BUILD_TYPE=Release
	cmake --build $(CPP_TEST_BUILD) -j $${MAX_JOBS:-2}
	$(CPP_TEST_BUILD)/recops_cpp_tests

# recops built against the oldest supported torch (requirements-compat.txt) and its suite run
# without FBGEMM, in a copy of the tree.
test-compat: $(COMPAT_STAMP)
	$(call copy_tree,$(COMPAT_TREE))
	cd $(COMPAT_TREE) && $(JOBS) $(COMPAT_PY) setup.py --quiet build_ext --inplace
	cd $(COMPAT_TREE) && RECOPS_HIDE_FBGEMM=1 $(COMPAT_PY) -m pytest -q tests

# The kernel families' tests against a sanitized build (pinned environment, a copy of the tree).
# The ASan runtime must be loaded first, so it is preloaded into the (unsanitized) Python, and
# libstdc++ with it: loaded later, ASan's __cxa_throw interceptor finds no real __cxa_throw and
# every C++ exception (each TORCH_CHECK) aborts. Leak checks are off (Python and torch keep their
# allocations until exit by design); --capture=sys lets a sanitizer report reach the log.
test-asan: setup
	$(call copy_tree,$(ASAN_TREE))
	cd $(ASAN_TREE) && RECOPS_SANITIZE=address,undefined RECOPS_CUDA=0 $(JOBS) \
		$(abspath $(PY)) setup.py --quiet build_ext --inplace
	ldd $(ASAN_TREE)/recops/_C*.so | grep -q libasan  # the build really is instrumented
	cd $(ASAN_TREE) && \
		LD_PRELOAD="$$($(CXX) -print-file-name=libasan.so) $$($(CXX) -print-file-name=libstdc++.so)" \
		ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
		$(abspath $(PY)) -m pytest -q -p no:cacheprovider --capture=sys $(ASAN_TESTS)

# recops inside torchrec: the plug-in and sharded training over 1, 2 and 4 local processes
# (tests/test_torchrec*.py; they skip where torchrec is absent, as in .venv). Same torch as .venv,
# so the in-place build serves both environments.
test-torchrec: build $(TORCHREC_STAMP)
	$(TORCHREC_PY) -m pytest -q tests/test_torchrec.py tests/test_torchrec_sharded.py tests/test_torchrec_vbe.py \
		tests/test_docs.py -k torchrec

# An installable wheel in dist/, requiring the torch release it was built against.
wheel: build
	$(PY) -m build --wheel --no-isolation --outdir dist

bench: build
	$(PY) benchmarks/run.py

# A served recommender under MLPerf LoadGen: recops' cached path vs the full recompute on recops'
# ops and on plain PyTorch (benchmarks/serving.py, docs/serving.md).
bench-serving: build $(SERVING_STAMP)
	$(PY) benchmarks/serving_quality.py
	$(PY) benchmarks/serving.py

# Sharded DLRM steps/s on torchrec, FBGEMM's kernels vs recops' (benchmarks/suites/torchrec.py).
bench-torchrec: build $(TORCHREC_STAMP)
	$(TORCHREC_PY) benchmarks/run.py torchrec

clean:
	rm -rf build dist recops/*.so
