"""An operator-graph candidate as a plan entry of the one result contract, and what the
explanation adds for graphs.

:class:`GraphEvaluated` is the graph's :class:`planner_service.planner.result.Evaluated`: the
strategy (``tp`` is the sharding axis, ``layers_per_stage`` counts operators), the node group of
every stage, the prediction, and on top the sharding of every operator, the operators of every
stage, the CPU parameter servers (when embedding tables live there) and the solver status.
Stages and ranks are placed like the transformer's (``planner.placement``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cost_model.cluster import Cluster
from cost_model.graph.evaluate import to_estimate
from cost_model.strategy import Strategy
from cost_model.units import BYTES_PER_GB, bytes_to_gb
from planner_service.planner.graph.space import MeshCandidate
from planner_service.planner.result import Evaluated

#: The sharding that places an embedding table on the CPU parameter servers.
CPU_TABLE_SHARDING = "embedding_on_cpu"
#: Bytes per table parameter the explanation quotes (bf16 weights).
TABLE_BYTES_PER_PARAM = 2


@dataclass(frozen=True, kw_only=True)
class GraphEvaluated(Evaluated):
    """A plan entry of an operator graph."""

    node_group: str
    op_shardings: Mapping[str, str]  # op name -> sharding name
    stage_ops: tuple[tuple[str, ...], ...]  # op names of each stage, in execution order
    embeddings: Mapping[str, Mapping[str, Any]]  # table op -> its sharding and size
    parameter_servers: Mapping[str, Any] | None = None
    solver_status: str = "GREEDY"

    def strategy_entry(self) -> dict[str, Any]:
        return {**self.strategy.to_dict(), "node_group": self.node_group, "op_shardings": dict(self.op_shardings)}

    def stage_entries(self, cluster: Cluster) -> list[dict[str, Any]]:
        out = super().stage_entries(cluster)
        for entry, ops in zip(out, self.stage_ops, strict=True):
            entry.update({
                "first_op": ops[0] if ops else None,
                "last_op": ops[-1] if ops else None,
                "num_ops": len(ops),
                "ops": {name: self.op_shardings[name] for name in ops},
            })
        return out

    def extra_entries(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.parameter_servers is not None:
            out["parameter_servers"] = dict(self.parameter_servers)
        out["solver_status"] = self.solver_status
        return out

    def explanation_details(self) -> dict[str, Any]:
        """The tightest stage's peak memory, shardings by how many operators use them, and the
        embedding tables' placement."""
        counts: dict[str, int] = {}
        for nm in self.op_shardings.values():
            counts[nm] = counts.get(nm, 0) + 1
        return {
            "peak_memory_GB": max(self.prediction.peak_memory_GB),
            "sharding_summary": dict(sorted(counts.items(), key=lambda kv: -kv[1])),
            "embeddings": {k: dict(v) for k, v in self.embeddings.items()},
        }


def op_shardings(c: MeshCandidate) -> dict[str, str]:
    tables = c.tables
    return {op.name: tables.names[int(tables.row_start[i] + c.choice[i])] for i, op in enumerate(tables.graph.ops)}


def to_evaluated(c: MeshCandidate) -> GraphEvaluated:
    """The plan entry of a candidate (its prediction from ``cost_model.graph.evaluate``)."""
    mesh, tables = c.mesh, c.tables
    graph = tables.graph
    names = op_shardings(c)
    stage_ops = tuple(tuple(graph.ops[i].name for i in sorted(s.ops, key=lambda i: tables.analysis.position[i]))
                      for s in c.ev.stages)
    strategy = Strategy(dp=mesh.dp, tp=mesh.t, pp=mesh.pp, micro_batch_size=mesh.micro_batch, zero_stage=mesh.zero_stage,
                        layers_per_stage=tuple(len(ops) for ops in stage_ops))
    prediction = to_estimate(tables, c.ev)
    servers = None
    cpu_tables = [n for n, sh in names.items() if sh == CPU_TABLE_SHARDING]
    if cpu_tables and mesh.cpu is not None:
        servers = {
            "hosts": list(mesh.cpu.hostnames), "node_groups": list(mesh.cpu.groups), "device": mesh.cpu.device.name,
            "tables": cpu_tables, "memory_GB": bytes_to_gb(c.ev.cpu_memory_bytes), "time_per_microbatch_s": c.ev.cpu_stage_s,
        }
    embeddings = {op.name: {"sharding": names[op.name], "table_GB": op.param_count * TABLE_BYTES_PER_PARAM / BYTES_PER_GB}
                  for op in graph.ops if op.category == "embedding" or (op.category == "gather" and op.params)}
    return GraphEvaluated(strategy=strategy, stage_groups=(mesh.group.name,) * mesh.pp, prediction=prediction,
                          objective=c.ev.step_time_s, node_group=mesh.group.name, op_shardings=names, stage_ops=stage_ops,
                          embeddings=embeddings, parameter_servers=servers, solver_status=c.solver_status)
