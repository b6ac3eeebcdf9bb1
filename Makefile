# Everything gbmw needs, in a local virtual environment, from a fresh CPU machine.
# torch==2.13.0 goes in first and is repeated in every pip command that brings a torch dependent
# (deepspeed, megatron-core): an unpinned torch resolves to a multi-GB CUDA build.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0

.PHONY: setup demo train-demo test test-unit clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e ".[runtime,test,figures]" $(TORCH)
	touch $@

demo: setup
	$(BIN)/gbmw plan gpt3-15b_a100-80g-x32

train-demo: setup
	rm -rf out/train-demo && mkdir -p out/train-demo
	$(BIN)/gbmw plan gpt-tiny_cpu-x4 -o out/train-demo/plan.yaml
	$(BIN)/torchrun --standalone --nproc_per_node 4 -m gbmw train gpt-tiny_cpu-x4 --plan out/train-demo/plan.yaml \
		--steps 20 --save out/train-demo/checkpoint

# The unit tier (the planner) runs with torch, DeepSpeed and megatron-core made unimportable, which proves it needs
# none of them; then the torch, dist and gpu tiers (tests/conftest.py), on WORKERS pytest-xdist processes, and last,
# alone, the tests that time how fast processes die (marker `serial`: a busy neighbour would slow what they time).
# Each session lists its slowest tests.
WORKERS ?= 2

test: test-unit
	$(BIN)/python -m pytest -q -m "not unit and not serial" -n $(WORKERS) --durations=15
	$(BIN)/python -m pytest -q -m serial --durations=5

test-unit: setup
	$(BIN)/python -m pytest -q -m unit --without-torch -n $(WORKERS) --durations=15

clean:
	rm -rf $(VENV)
