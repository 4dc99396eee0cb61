# One command sets up and runs the main job (`make run`: train a ViT on digits, print test accuracy), one sets up and runs the tests (`make test`,
# the documentation build among them: the docs extra is installed with the test extras).
# The virtual environment is (re)built whenever pyproject.toml changes.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.14.1 torchvision==0.29.1
BIN := $(VENV)/bin

# The GPU acceptance run (docs/guide/gpu.md): `make gpu-wheels gpu-data` here, then `make gpu-check` on the GPU
# machine with .whl and .gpu-data carried beside the tree (both git-ignored).
GPU_WHEELS ?= webdataset==1.0.2 braceexpand==0.1.7
DATA_ROOT ?= ../shared/data
GPU_SITE ?= /tmp/vitkit-gpu-site

.PHONY: setup run test bench clean gpu-wheels gpu-data gpu-check

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python -m pip install -q -e '.[dev,docs]'
	touch $@

run: setup
	$(BIN)/vitkit train

test: setup
	$(BIN)/python -m pytest -q --durations=10 $(PYTEST_ARGS)

gpu-wheels:
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: -d .whl $(GPU_WHEELS)

gpu-data:
	mkdir -p .gpu-data && install -m 644 $(DATA_ROOT)/cifar10-subset/cifar10_subset.npz .gpu-data/

gpu-check:
	if ls .whl/*.whl >/dev/null 2>&1; then $(PYTHON) -m pip install -q --no-index --no-deps --no-compile \
		--no-cache-dir --upgrade --target $(GPU_SITE) .whl/*.whl; fi
	PYTHONPATH=src:$(GPU_SITE) PYTHONUNBUFFERED=1 $(PYTHON) benchmarks/gpu_check.py --data .gpu-data/cifar10_subset.npz

clean:
	rm -rf $(VENV) .pytest_cache runs
