# Chandy: `make demo` sets everything up and runs the main job; `make test` runs the tests.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
CHANDY := $(VENV)/bin/chandy

.PHONY: setup kafka-jars schema-registry iceberg-rest azurite spark-cds test-tools check docs demo test bench bench-setup bench-streaming clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,demo]'
	touch $@

# the pinned Apache Kafka jars, from Maven Central into the user cache (once)
kafka-jars: setup
	$(PY) -c "from chandy.broker import resolve_kafka_jars; print('Kafka jars in', resolve_kafka_jars())"

# Apicurio Registry, the Confluent-compatible Schema Registry the tests start (tests/fixtures/schema_registry.py):
# its server bundle from Maven Central into the user cache (once); CHANDY_APICURIO_HOME names an unpacked one instead
schema-registry: setup
	$(PY) -c "from tests.fixtures.schema_registry import resolve_apicurio; print('Apicurio Registry in', resolve_apicurio())"

# Apache Iceberg's REST catalog server (org.apache.iceberg:iceberg-open-api, a self-contained jar) the
# tests start (tests/fixtures/iceberg_rest.py): from Maven Central into the user cache (once)
iceberg-rest: setup
	$(PY) -c "from tests.fixtures.iceberg_rest import resolve_iceberg_rest; print('Iceberg REST catalog in', resolve_iceberg_rest())"

# Azurite (the Azure Storage emulator, from npm) for the object-store tests, into the venv; without
# npm the Azure tests are skipped and say why
AZURITE_VERSION ?= 3.37.0
azurite: setup
	@if command -v npm >/dev/null 2>&1; then \
	  test -x $(VENV)/azurite/node_modules/.bin/azurite-blob || \
	  npm install --prefix $(VENV)/azurite --no-audit --no-fund --silent azurite@$(AZURITE_VERSION); \
	else echo "npm is missing: the Azure (Azurite) tests will be skipped"; fi

demo: kafka-jars
	$(CHANDY) kafka up
	$(CHANDY) demo

# a class-data-sharing archive of the Spark driver JVM (tests/fixtures/spark_jvm.py), once per venv and
# JDK: the Spark sessions the tests start map their classes from it (about 4 s less per pipeline process)
spark-cds: setup
	$(PY) -m tests.fixtures.spark_jvm

# the checks run first: ruff (lint, import order, bugbear, blind excepts, unused noqa), mypy (every
# package of chandy) and the import contracts (layers)
check: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# the documentation site (mkdocs.yml): the pages of docs/ and the API reference rendered from the
# docstrings, into site/; --strict fails on a broken link, anchor or cross-reference
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# what the tests need besides Python packages: stop at once, in one line, naming what to install
test-tools:
	@command -v java >/dev/null 2>&1 || { echo "make test needs Java 17+: apt-get install openjdk-17-jre-headless"; exit 1; }
	@command -v chromium >/dev/null 2>&1 || { echo "make test needs Chromium (the dashboard's browser test): apt-get install chromium"; exit 1; }
	@command -v prometheus >/dev/null 2>&1 || { echo "make test needs Prometheus (the Grafana dashboard's PromQL test): apt-get install prometheus"; exit 1; }

test: test-tools kafka-jars schema-registry iceberg-rest azurite spark-cds check
	$(PY) -m pytest $(PYTEST_ARGS)

bench: kafka-jars
	$(PY) benchmarks/roundtrip_latency.py
	$(PY) benchmarks/checkpoint_latency.py
	$(PY) benchmarks/recovery.py
	$(PY) benchmarks/metrics_overhead.py
	$(PY) benchmarks/json_decode.py
	$(PY) benchmarks/json_decode.py --value-format avro
	$(PY) benchmarks/json_decode.py --value-format protobuf

# the benchmarks against Spark Structured Streaming, in an environment of their own whose pyspark has
# its Kafka, Avro and Delta connectors on Maven Central (pyproject's `bench` extra)
BENCH_VENV ?= .venv-bench
bench-setup: $(BENCH_VENV)/.installed

$(BENCH_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install --quiet -e '.[bench]'
	touch $@

# throughput (raw, JSON and Avro values) and end-to-end latency, Chandy and Structured Streaming side by
# side, medians of 5 runs: results in benchmarks/results/, the tables of docs/benchmarks.md generated from them
bench-streaming: bench-setup kafka-jars
	$(BENCH_VENV)/bin/python benchmarks/pipeline_vs_structured_streaming.py --suite
	$(BENCH_VENV)/bin/python benchmarks/end_to_end_latency.py
	$(BENCH_VENV)/bin/python benchmarks/results_table.py --write docs/benchmarks.md

clean:
	-$(CHANDY) kafka down
	rm -rf $(VENV) $(BENCH_VENV) .pytest_cache .hypothesis .cache
