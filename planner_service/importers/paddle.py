"""PaddlePaddle auto-parallel cluster JSON → v1 cluster.

Format (Paddle ``python/paddle/distributed/auto_parallel/static/cluster.py``,
``Cluster.build_from_file``; docs/integration.md §6): top-level ``machines`` (and
``alpha_latency``); each machine has ``hostname``, ``addr``, ``port``, ``devices`` (``global_id``,
``local_id``, ``type`` GPU|CPU|NIC|..., ``model``, ``memory`` in GB, ``sp/dp/hp_gflops``; a NIC has
``width``) and ``links`` (``source_global_id``, ``target_global_id``, ``type``
LOC|SYS|PHB|PIX|PIB|NVL|NVB|NET, ``bandwidth`` GB/s).  Numbers may be JSON strings (Paddle's own
test files write ``"memory": "32"``).

Mapping: the GPU ``model`` → catalog device (memory disambiguates); intra-node bandwidth = the
slowest GPU↔GPU link inside the machine (Paddle's own cost model also takes the slowest link of
a group); inter-node bandwidth = the sum of the machine's NIC ``width`` (GB/s) when NICs are
listed, else the slowest ``NET`` link leaving the machine, else the catalog default.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from cost_model.errors import InvalidCluster
from cost_model.units import bytes_to_mib, gb_to_bytes
from planner_service.importers.common import NodeRecord, catalog_id_for, group_nodes

ACCELERATORS = ("GPU", "XPU", "DCU", "NPU")


def _num(value: Any, field_path: str) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise InvalidCluster(f"must be a number, got {value!r}", field=field_path) from None
    if out < 0:
        raise InvalidCluster(f"must be non-negative, got {value!r}", field=field_path)
    return out


def import_paddle(text: str, name: str = "paddle-cluster") -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidCluster(f"is not JSON: {exc.msg} at line {exc.lineno}", field="paddle") from None
    if not isinstance(data, Mapping):
        raise InvalidCluster("must be an object with 'machines'", field="paddle")
    machines = data.get("machines")
    if not isinstance(machines, list) or not machines:
        raise InvalidCluster("must be a non-empty list of machines", field="paddle.machines")
    device_machine: dict[int, int] = {}
    device_type: dict[int, str] = {}
    records: list[NodeRecord] = []
    parsed: list[tuple[dict, list]] = []
    for i, m in enumerate(machines):
        mp = f"paddle.machines[{i}]"
        if not isinstance(m, Mapping):
            raise InvalidCluster("must be an object", field=mp)
        host = m.get("hostname") or m.get("addr")
        if not isinstance(host, str) or not host.strip():
            raise InvalidCluster("needs a 'hostname' (or 'addr')", field=f"{mp}.hostname")
        devices = m.get("devices")
        if not isinstance(devices, list) or not devices:
            raise InvalidCluster("must be a non-empty list of devices", field=f"{mp}.devices")
        for j, d in enumerate(devices):
            dp_ = f"{mp}.devices[{j}]"
            if not isinstance(d, Mapping) or "global_id" not in d or "type" not in d:
                raise InvalidCluster("needs 'global_id' and 'type'", field=dp_)
            gid = int(_num(d["global_id"], f"{dp_}.global_id"))
            if gid in device_machine:
                raise InvalidCluster(f"global_id {gid} is used twice", field=f"{dp_}.global_id")
            device_machine[gid] = i
            device_type[gid] = str(d["type"]).upper()
        links = m.get("links") or []
        if not isinstance(links, list):
            raise InvalidCluster("must be a list", field=f"{mp}.links")
        parsed.append((m, links))

    for i, (m, links) in enumerate(parsed):
        mp = f"paddle.machines[{i}]"
        gpus = [d for d in m["devices"] if str(d["type"]).upper() in ACCELERATORS]
        if not gpus:
            raise InvalidCluster("has no accelerator (GPU/XPU/DCU/NPU) devices", field=f"{mp}.devices")
        models = {str(d.get("model", "")).strip() for d in gpus}
        if len(models) != 1 or not next(iter(models)):
            raise InvalidCluster(f"must have one GPU model per machine, got {sorted(models)}", field=f"{mp}.devices")
        model = models.pop()
        mem_GB = _num(gpus[0].get("memory", 0), f"{mp}.devices[0].memory")
        device = catalog_id_for(model, bytes_to_mib(gb_to_bytes(mem_GB)) if mem_GB else None, field_path=f"{mp}.devices[0].model")
        gpu_ids = {int(_num(d["global_id"], f"{mp}.devices.global_id")) for d in gpus}
        intra: list[float] = []
        net: list[float] = []
        for k, link in enumerate(links):
            lp = f"{mp}.links[{k}]"
            if not isinstance(link, Mapping):
                raise InvalidCluster("must be an object", field=lp)
            for key in ("source_global_id", "target_global_id", "type", "bandwidth"):
                if key not in link:
                    raise InvalidCluster(f"needs '{key}'", field=lp)
            src = int(_num(link["source_global_id"], f"{lp}.source_global_id"))
            dst = int(_num(link["target_global_id"], f"{lp}.target_global_id"))
            for end, gid in (("source_global_id", src), ("target_global_id", dst)):
                if gid not in device_machine:
                    raise InvalidCluster(f"device {gid} is not declared", field=f"{lp}.{end}")
            bw = _num(link["bandwidth"], f"{lp}.bandwidth")
            if bw <= 0:
                raise InvalidCluster("must be positive", field=f"{lp}.bandwidth")
            if src in gpu_ids and dst in gpu_ids and src != dst:
                intra.append(bw)
            elif str(link["type"]).upper() == "NET" or device_machine[dst] != i:
                net.append(bw)
        nics = [d for d in m["devices"] if str(d["type"]).upper() == "NIC"]
        nic_total = sum(_num(d.get("width", 0), f"{mp}.devices.width") for d in nics)
        inter = nic_total if nic_total > 0 else (min(net) if net else None)
        records.append(
            NodeRecord(
                hostname=str(m.get("hostname") or m.get("addr")).strip(),
                device=device,
                gpus=len(gpus),
                intra_node_bandwidth_GBps=min(intra) if intra and len(gpus) > 1 else None,
                inter_node_bandwidth_GBps=inter,
            )
        )
    return group_nodes(records, name)
