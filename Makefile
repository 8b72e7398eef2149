# The two commands of the README:
#   make run    set up (first time) and open RadixChat on the default model
#   make test   set up (first time), provision the test models, run the tests
#   make app    the packaged app with PyInstaller: dist/RadixChat/ (Linux), dist/RadixChat.app (macOS)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup run test app clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $@

setup: $(VENV)/.installed

run: setup
	$(BIN)/radixchat

test: setup
	$(BIN)/radixchat fetch-model default
	$(BIN)/radixchat fetch-model gemma3-270m
	$(BIN)/python -m pytest

# PyInstaller and Pillow (the `package` extra), once per change of pyproject.toml
$(VENV)/.installed-package: $(VENV)/.installed
	$(BIN)/python -m pip install --quiet -e ".[dev,package]"
	touch $@

app: $(VENV)/.installed-package
	$(BIN)/pyinstaller --noconfirm --clean --log-level WARN pyinstaller.spec

clean:
	rm -rf $(VENV) build dist *.egg-info
