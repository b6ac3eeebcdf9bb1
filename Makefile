# Everything gbmw needs, in a local virtual environment, from a fresh CPU machine.
# torch==2.13.0 goes in first and is repeated in every pip command that brings a torch dependent
# (deepspeed, megatron-core): an unpinned torch resolves to a multi-GB CUDA build.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0

.PHONY: setup demo test clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e ".[runtime,test,figures]" $(TORCH)
	touch $@

demo: setup
	$(BIN)/gbmw plan gpt3-15b_a100-80g-x32

test: setup
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV)
