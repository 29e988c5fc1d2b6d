# Two commands on a fresh machine: `make run` (the service on the shipped model) and `make test`.
TORCH_SPEC ?= torch==2.13.0
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
CHECKPOINT ?= checkpoints/default

.PHONY: run test lint bench browser audio clean

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)

# Torch goes in first, pinned, so the project's looser `torch>=` never pulls a CUDA build. `make run` installs
# the library and the server; `make test` everything the tests reach (training, evaluation, the corpus).
$(VENV)/.torch: | $(BIN)/activate
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	touch $@

$(VENV)/.installed-serve: pyproject.toml $(VENV)/.torch
	$(BIN)/pip install --quiet -e ".[serve]"
	touch $@

$(VENV)/.installed: pyproject.toml $(VENV)/.torch
	$(BIN)/pip install --quiet -e ".[serve,train,eval,corpus,dev]"
	touch $@ $(VENV)/.installed-serve

run: $(VENV)/.installed-serve
	$(BIN)/musicrel serve --checkpoint $(CHECKPOINT) --host $(HOST) --port $(PORT)

# Headless Chromium for the web-page test (Debian package; Playwright never downloads a browser here).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium missing: run 'sudo apt-get install chromium' for the browser test"; fi; }

# The synthesizer and General MIDI soundfont report.html renders its audio with (Debian packages; pyfluidsynth,
# in the `report` extra, loads libfluidsynth).
audio:
	@{ command -v fluidsynth >/dev/null 2>&1 && [ -f /usr/share/sounds/sf2/TimGM6mb.sf2 ]; } || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && \
	    apt-get install -y -qq --no-install-recommends fluidsynth timgm6mb-soundfont >/dev/null; \
	  else echo "fluidsynth or soundfont missing: run 'sudo apt-get install fluidsynth timgm6mb-soundfont'"; fi; }

lint: $(VENV)/.installed
	$(BIN)/ruff check .

# Two workers (pytest-xdist), whole files each so a module's fixtures are built once; the files with `long`
# tests first (tests/conftest.py). TEST_WORKERS=0 runs in one process; the 20 slowest tests are listed at the end.
TEST_WORKERS ?= 2
test: $(VENV)/.installed browser audio lint
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=20

bench: $(VENV)/.installed
	$(BIN)/pip install --quiet -e ".[bench]"
	$(BIN)/musicrel bench codec
	$(BIN)/musicrel bench attention
	$(BIN)/musicrel bench generate

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
