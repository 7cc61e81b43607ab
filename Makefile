# kvpilot: `make test` installs everything into .venv, builds (or reuses) the local control
# plane, lints, and runs the whole test suite. `make demo` runs the main job.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

.PHONY: test install controlplane lint pytest demo clean chart chart-crds chart-dashboards images

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed

# Builds etcd, kube-apiserver/-controller-manager/-scheduler, kwok and helm from tools/*/go.mod into
# ${KVPILOT_CACHE_DIR:-~/.cache/kvpilot}/bin, or reuses them (see docs/benchmarks.md for timings).
controlplane: install
	$(VENV)/bin/kvpilot cluster build

lint: install
	$(VENV)/bin/ruff check kvpilot tests bench

pytest: install
	@set +e; $(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest: no tests collected (exit 5), not a failure"; rc=0; fi; exit $$rc

test: install controlplane lint pytest

# The chart ships copies of crds/ and dashboards/ (helm reads only files inside the chart);
# tests/cluster/test_chart.py fails when they drift: run `make chart` after changing either.
CHART := charts/kvpilot
chart: chart-crds chart-dashboards

chart-crds:
	mkdir -p $(CHART)/crds
	rm -f $(CHART)/crds/*.yaml
	cp crds/*.yaml $(CHART)/crds/

chart-dashboards:
	rm -rf $(CHART)/dashboards
	if compgen -G 'dashboards/*.json' >/dev/null; then mkdir -p $(CHART)/dashboards && cp dashboards/*.json $(CHART)/dashboards/; fi

# Both container images, daemonless (mmdebstrap + crane, as root), into build/images/ as
# `docker load`-able tarballs; each is smoke-run in its unpacked root filesystem (images/README.md).
images: controlplane
	$(PY) -m kvpilot.images operator engine

demo: install
	$(VENV)/bin/kvpilot demo

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
