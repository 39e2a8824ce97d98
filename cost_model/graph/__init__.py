"""The operator-graph model family: any DAG of operators, sharded per operator and split into
pipeline stages.

Modules, in import order (each imports only those above it):

* :mod:`~cost_model.graph.ir` — the IR (dimensions, tensors, parameters, operators, the graph),
  the operator catalog, dtypes and size caps;
* :mod:`~cost_model.graph.shapes` — shape inference per operator type;
* :mod:`~cost_model.graph.parse` — parsing and validation of the ``model.graph`` document, its
  JSON Schema and an example;
* :mod:`~cost_model.graph.op_cost` — FLOPs, bytes and saved activations per operator;
* :mod:`~cost_model.graph.analysis` — chain order and kernel fusion (independent of the mesh);
* :mod:`~cost_model.graph.mesh` — the device mesh and the CPU parameter-server pool;
* :mod:`~cost_model.graph.layouts` — sharding layouts, the choices of each operator, resharding;
* :mod:`~cost_model.graph.tables` — the cost tables of every (operator, choice) row and edge;
* :mod:`~cost_model.graph.assign` — greedy sharding and the pipeline split;
* :mod:`~cost_model.graph.evaluate` — the step time of one assignment and the estimate of one
  strategy.
"""
