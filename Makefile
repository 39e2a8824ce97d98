PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv run lint test bench-fidelity bench-plan bench-service bench-cpu bench-lora-cpu bench-graph bench-repro bench-physics bench bench-loop bench-acceptance bench-report clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $(STAMP)

venv: $(STAMP)

# Loopback only, so without keys (planner serve refuses PLANNER_AUTH=disabled elsewhere).
run: export PLANNER_AUTH = disabled
run: $(STAMP)
	$(BIN)/planner serve --host 127.0.0.1 --port 8000

# ruff over the whole tree; mypy --strict on cost_model/ and planner_service/planner/
# (scope and settings in pyproject.toml's [tool.ruff] and [tool.mypy]).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

test: $(STAMP)
	$(BIN)/python -m pytest

# The peer (llm-analysis, the bench extra) runs on the same rows in the same run.
# The peer installed without its dependencies: they pin transformers 4.31 and huggingface-hub < 0.15,
# which the peer (explicit model configs, no Hub) does not use and which break torchtitan's datasets
# beside it (the launch-file tests); fire is what llm_analysis imports.  The pin is pyproject's bench extra's.
bench-fidelity: $(STAMP)
	$(BIN)/python -m pip install -q --no-deps "$$(grep -o 'llm-analysis==[0-9.]*' pyproject.toml)"
	$(BIN)/python -m pip install -q fire
	$(BIN)/python bench/fidelity.py

bench-acceptance: $(STAMP)
	$(BIN)/python bench/acceptance.py

bench-plan: $(STAMP)
	$(BIN)/python bench/plan_speed.py

bench-service: $(STAMP)
	$(BIN)/python bench/service_load.py

bench-cpu: $(STAMP)
	$(BIN)/python bench/cpu_validation.py

bench-lora-cpu: $(STAMP)
	$(BIN)/python bench/lora_cpu.py

bench-graph: $(STAMP)
	$(BIN)/python bench/graph_bench.py

bench-repro: $(STAMP)
	$(BIN)/python bench/reproducibility.py

bench-physics: $(STAMP)
	$(BIN)/python bench/physics_cases.py

bench-loop: $(STAMP)
	$(BIN)/python bench/closed_loop.py

bench-report: $(STAMP)
	$(BIN)/python bench/report.py

bench: bench-fidelity bench-plan bench-service bench-cpu bench-lora-cpu bench-graph bench-repro bench-physics bench-loop bench-acceptance bench-report

clean:
	rm -rf $(VENV) *.egg-info planner.db
