# The commands of the README:
#   make run    set up (first time) and open RadixChat on the default model
#   make test   set up (first time), provision the test models, run the tests
#   make app    the packaged app with PyInstaller: dist/RadixChat/ (Linux), dist/RadixChat.app (macOS),
#               built from the exact versions of requirements-lock.txt
#   make lock   write requirements-lock.txt anew from pyproject.toml's ranges (after changing them)
#
# The Python: PYTHON=/path/to/python3.x names one; otherwise the first of python3.13,
# python3.12, python3.11 and python3 on the PATH that is 3.11 or newer (mlx-lm 0.32 needs
# 3.11; a stock Mac's python3 is Xcode's 3.9). None: setting up stops with one line.
MIN_PYTHON := 3.11
PYTHON_CANDIDATES := python3.13 python3.12 python3.11 python3
VENV ?= .venv
BIN := $(VENV)/bin

FOUND_PYTHON := $(shell for p in $(or $(PYTHON),$(PYTHON_CANDIDATES)); do \
	found=$$(command -v "$$p" 2>/dev/null) && \
	"$$found" -c 'import sys; sys.exit(sys.version_info < tuple(map(int, "$(MIN_PYTHON)".split("."))))' \
		>/dev/null 2>&1 && { echo "$$found"; break; }; done)
NO_PYTHON := RadixChat needs Python $(MIN_PYTHON) or newer and found none \
	($(if $(PYTHON),PYTHON=$(PYTHON),tried $(PYTHON_CANDIDATES))): on a Mac `brew install python@3.13` \
	or python.org's installer, on Debian or Ubuntu `sudo apt install python3-venv`; \
	then make again, or make PYTHON=/path/to/python3.x

# The tests run in one process per core (pytest-xdist; at most 4: each loads its own models),
# a file's tests in one process, so a module's fixtures are made once. TEST_WORKERS=0: one
# process, in order (a debugger, or a test's output as it runs).
TEST_WORKERS ?= auto

.PHONY: setup run test app lock clean

$(VENV)/.installed: pyproject.toml
	$(if $(FOUND_PYTHON),,$(error $(NO_PYTHON)))
	$(FOUND_PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $@

setup: $(VENV)/.installed

run: setup
	$(BIN)/radixchat

test: setup
	$(BIN)/radixchat fetch-model default
	$(BIN)/radixchat fetch-model gemma3-270m
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --maxprocesses 4 --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# The packaged app is built from exact versions (requirements-lock.txt, with the `dev` and
# `package` extras: PyInstaller, Pillow), whatever the ranges would pick today; a user's
# `pip install` keeps pyproject.toml's ranges.
$(VENV)/.installed-package: $(VENV)/.installed requirements-lock.txt
	$(BIN)/python -m pip install --quiet -r requirements-lock.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $@

app: $(VENV)/.installed-package
	$(BIN)/pyinstaller --noconfirm --clean --log-level WARN pyinstaller.spec

# uv's resolver writes one lock for every platform (mlx-metal on macOS, mlx-cpu on Linux)
# and every Python from requires-python up.
lock: setup
	$(BIN)/python -m pip install --quiet uv
	$(BIN)/uv pip compile pyproject.toml --extra dev --extra package --universal \
		--python-version $(MIN_PYTHON) --no-annotate --quiet --custom-compile-command "make lock" \
		-o requirements-lock.txt

clean:
	rm -rf $(VENV) build dist *.egg-info
