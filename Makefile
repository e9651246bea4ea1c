# Two entry points a person needs: `make simulate` (set up + run the embedded default) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: simulate test test-real horovod control-plane helm karpenter lint chaos docs clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

simulate: $(VENV)/.installed
	$(BIN)/spot-autoscaler simulate

# With Go on the machine, the real control plane and helm are built first (cached; ~25 min and
# ~4 min cold) and the real-cluster and chart tests run; without Go they are skipped, and one
# line says so and how.
test: $(VENV)/.installed
	@if command -v go >/dev/null 2>&1 || [ -x /usr/local/go/bin/go ]; then \
		scripts/build-control-plane.sh && scripts/build-helm.sh && scripts/build-karpenter.sh; \
	else \
		echo "make test: no Go here: the real-cluster and chart tests are skipped (install Go 1.26, then make control-plane helm karpenter)"; \
	fi
	$(BIN)/python -m pytest -n 2 --dist loadgroup

# Only the tests against the real control plane (built first if not cached; also part of `make test`).
test-real: $(VENV)/.installed
	scripts/build-control-plane.sh
	scripts/build-helm.sh
	scripts/build-karpenter.sh
	REQUIRE_REAL_CLUSTER=1 $(BIN)/python -m pytest -m real_cluster

# Optional: horovod 0.28.1 + torch (CPU) for the end-to-end test; needs a compiler, ~4 min cold.
horovod: $(VENV)/.installed
	scripts/build-horovod.sh $(BIN)/python

# Optional: etcd, kube-apiserver, -controller-manager, -scheduler, kwok and mpi-operator built from
# source (scripts/control-plane.versions) for tests marked real_cluster; needs Go, ~25 min cold.
control-plane:
	scripts/build-control-plane.sh

# helm (scripts/helm.versions) from the Go module proxy, for the chart tests (tests/test_helm*.py);
# needs Go, ~4 min cold.
helm:
	scripts/build-helm.sh

# Karpenter's kwok provider (scripts/karpenter.versions) from the Go module proxy, for the
# Karpenter tests (tests/test_real_karpenter.py); needs Go, ~8 min cold.
karpenter:
	scripts/build-karpenter.sh

lint: $(VENV)/.installed  # import contracts, ruff check + format, mypy: also part of `make test`
	$(BIN)/python -m pytest -q tests/test_layering.py tests/test_static_checks.py

# The long fault suite (docs/reliability.md): 40 nodes, 4 jobs, 40 notices, 5-20% faults, ~3 min.
# CHAOS_SEED=<n> picks the seed; CHAOS_JSON=<path> appends the report as a JSON line.
chaos: $(VENV)/.installed
	CHAOS_LONG=1 $(BIN)/python -m pytest -q -s -p no:cacheprovider tests/test_chaos.py
	CONFIG_FUZZ_FILES=10000 $(BIN)/python -m pytest -q -p no:cacheprovider tests/test_config_fuzz.py

# docs/configuration.md and the chart's values.schema.json `config` from the config model
# (tests/test_config_reference.py, tests/test_helm_schema.py fail while stale)
docs: $(VENV)/.installed
	$(BIN)/python -m autoscaler.config.reference > docs/configuration.md
	$(BIN)/python -m autoscaler.config.helm_schema

clean:
	rm -rf $(VENV) simulate-out .pytest_cache
