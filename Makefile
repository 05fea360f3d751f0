# make demo / make test work on a fresh machine: they create .venv and install pinned versions.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.qvl-installed
# Exact versions for this machine (CPU torch that imports beside torchvision); pyproject keeps ranges.
# numpy below 2.4: the serving engine's mistral_common requires it on Python <= 3.12.
# scipy and statsmodels (with pandas, patsy) are test oracles: the field's own statistics that eval's are checked against.
PINS := torch==2.14.1 torchvision==0.29.1 transformers==5.15.1 typer==0.29.2 rich==15.0.0 \
        pyyaml==6.0.4 pillow==13.0.0 av==18.1.0 filelock==4.3.1 pytest==9.2.0 hypothesis==6.170.17 ruff==0.17.6 \
        accelerate==1.16.0 psutil==7.2.2 matplotlib==3.11.2 ray==2.60.0 kubernetes-validate==1.37.0 \
        pytest-xdist==3.8.0 easy-vqa==1.0 numpy==2.3.5 vllm-router==0.1.17 \
        pytest-timeout==2.4.0 scipy==1.17.1 statsmodels==0.15.0 pandas==3.1.1 patsy==1.0.3 packaging==26.4
# optimum-rbln 0.12.0 pins torch 2.13 / torchvision 0.28: installed without its dependencies beside the CPU torch above
# (what it imports at run time is in PINS: accelerate, psutil), so tests and `qvl ... --emulate` run its real code.
OPTIMUM_RBLN := optimum-rbln==0.12.0
# The serving engine the engine tests run (`qvl serve --emulate`; ../shared/engine/README.md): vLLM 0.22.0 is the
# registry's wheel installed without its dependencies (its CUDA kernels are never loaded: vllm-rbln's platform imports
# none), beside the project's own torch, torchvision, transformers and tokenizers; ENGINE_PINS are the rest of its
# Requires-Dist, resolved, minus the GPU kernel packages (flashinfer*, tilelang, nvidia-*, fastsafetensors,
# quack-kernels, tokenspeed-mla, humming-kernels), with fastapi below 0.137 as vllm-rbln pins it. xgrammar (vLLM
# imports it at start-up) declares transformers<5 and triton: installed without them, with the apache-tvm-ffi it
# loads. vllm-rbln v0.11.1a1 is not on the registry: its archive sits in shared/ beside this repository.
VLLM := vllm==0.22.0
VLLM_RBLN := ../shared/engine/vllm-rbln-0.11.1a1.tar.gz
ENGINE_NO_DEPS := $(VLLM) xgrammar==0.2.5.post1 apache-tvm-ffi==0.1.9
ENGINE_PINS := agent-detector==2.0.0 aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 anthropic==2.16.0 \
        astor==0.8.1 blake3==1.0.11 cachetools==8.0.2 cbor2==6.3.0 cffi==2.1.1 cloudpickle==3.1.3 \
        compressed-tensors==0.15.0.1 cryptography==50.0.2 depyf==0.20.0 detect-installer==0.2.1 dill==0.4.1 \
        diskcache==5.6.3 dnspython==2.9.2 docstring_parser==0.18.0 einops==0.8.2 email-validator==2.4.0 \
        fastapi-cli==0.0.34 fastapi-cloud-cli==0.28.0 fastapi==0.136.3 fastar==0.12.0 frozenlist==1.8.0 gguf==0.19.0 \
        googleapis-common-protos==1.76.0 grpcio==1.85.3 httpcore2==2.16.2 httptools==0.9.0 httpx2==2.16.2 \
        ijson==3.6.0 interegular==0.3.3 jiter==0.19.0 jmespath==1.1.0 lark==1.2.2 llguidance==1.7.6 \
        llvmlite==0.47.0 lm-format-enforcer==0.11.3 loguru==0.7.3 mcp-types==2.3.0 mcp==2.3.0 \
        mistral_common==1.13.1 model-hosting-container-standards==0.1.16 msgspec==0.23.0 multidict==7.2.1 \
        ninja==1.13.2 numba==0.65.0 openai-harmony==0.0.8 openai==3.60.0 opencv-python-headless==5.1.0.95 \
        opentelemetry-api==1.45.2 opentelemetry-exporter-http-transport==0.66b2 \
        opentelemetry-exporter-otlp-common==0.66b2 opentelemetry-exporter-otlp-proto-common==1.45.2 \
        opentelemetry-exporter-otlp-proto-grpc==1.45.2 opentelemetry-exporter-otlp-proto-http==1.45.2 \
        opentelemetry-exporter-otlp==1.45.2 opentelemetry-proto==1.45.2 opentelemetry-sdk==1.45.2 \
        opentelemetry-semantic-conventions-ai==0.5.1 opentelemetry-semantic-conventions==0.66b2 \
        outlines_core==0.2.14 partial-json-parser==0.2.1.1.post7 prometheus-fastapi-instrumentator==8.1.0 \
        prometheus_client==0.26.0 propcache==0.5.4 py-cpuinfo==9.0.0 pybase64==1.5.1 pycountry==26.2.16 \
        pycparser==3.12 pydantic-extra-types==2.11.1 pydantic-settings==2.16.3 PyJWT==2.15.1 python-dotenv==1.2.4 \
        python-json-logger==4.2.0 python-multipart==0.0.34 pyzmq==27.3.0 rich-toolkit==0.20.6 rignore==0.8.1 \
        sentencepiece==0.2.3 sentry-sdk==2.76.0 setproctitle==1.3.8 sniffio==1.3.1 sse-starlette==3.7.1 \
        starlette==1.10.0 supervisor==4.3.0 tiktoken==0.14.0 truststore==0.10.5 uvicorn==0.55.0 uvloop==0.23.0 \
        watchfiles==1.3.0 websockets==17.4 yarl==1.25.1

.PHONY: install demo test lint bench clean

$(STAMP): pyproject.toml Makefile
	@test -f $(VLLM_RBLN) || { echo "make: $(VLLM_RBLN) is missing: the shared/ folder (vllm-rbln for the engine tests) must sit beside this repository" >&2; exit 2; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check $(PINS) $(ENGINE_PINS)
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps $(OPTIMUM_RBLN) $(ENGINE_NO_DEPS) $(VLLM_RBLN)
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps -e .
	# bytecode, as a regular (non-editable) install writes it: qvl starts fast even where PYTHONDONTWRITEBYTECODE is set
	$(BIN)/python -m compileall -q qwenvl_rbln
	touch $(STAMP)

install: $(STAMP)

demo: install
	PATH=$(abspath $(BIN)):$$PATH bash scripts/demo.sh

# Two pytest-xdist workers (CI has two cores), one test file per worker at a time so a module's fixtures (a compiled
# artifact, a local Ray, an engine server) are built once; about 4 min here instead of about 7 serially. The engine
# tests (tests/test_engine_*.py: the real vLLM and vllm-rbln over the emulated NPU) are part of it.
test: install
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

lint: install
	$(BIN)/ruff check qwenvl_rbln tests benchmarks scripts
	$(BIN)/ruff format --check qwenvl_rbln tests benchmarks scripts

bench: install
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) qvl-out .pytest_cache
