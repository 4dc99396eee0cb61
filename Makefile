# One command sets up and runs the main job (`make run`: train a ViT on digits, print test accuracy), one sets up and runs the tests (`make test`,
# the documentation build among them: the docs extra is installed with the test extras).
# The virtual environment is (re)built whenever pyproject.toml changes.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.14.1 torchvision==0.29.1
BIN := $(VENV)/bin

.PHONY: setup run test bench clean

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

clean:
	rm -rf $(VENV) .pytest_cache runs
