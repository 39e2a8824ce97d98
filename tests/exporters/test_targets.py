"""Launch artifacts: every target renders for a homogeneous and a mixed-device plan; scripts
parse; YAML matches the operators' CRD schemas; Megatron flags are Megatron's; and — run
against fake launchers — every rank lands on the plan's host and GPU."""

from __future__ import annotations

import csv
import io
import itertools
import json
import shutil
import subprocess
import tomllib
from importlib import resources
from pathlib import Path

import pytest
import yaml

from cost_model.errors import InvalidInput
from helpers.launch_sim import Sim, affinity_hosts, plan_mapping
from helpers.plans import (
    ALL_PLANS,
    homogeneous_plan,
    mixed_plan,
    uneven_gpu_plan,
)
from planner_service.exporters import TARGETS, LaunchParams, render
from planner_service.exporters.frameworks import megatron_layout, megatron_reference

PARAMS = LaunchParams(image="nvcr.io/nvidia/pytorch:24.05-py3", command="train.py --config cfg.yaml", queue="gpu", smoke_test=False)
PLAN_NAMES = list(ALL_PLANS)


def _render(plan_name: str, target: str, **kw) -> tuple[dict, object]:
    plan = ALL_PLANS[plan_name]()
    params = LaunchParams(**{**PARAMS.__dict__, **kw})
    return plan, render(plan, target, params)


# --- every target renders; scripts and documents parse ---------------------------------------


@pytest.mark.parametrize("plan_name", PLAN_NAMES)
@pytest.mark.parametrize("target", list(TARGETS))
def test_every_target_renders_and_parses(plan_name, target, tmp_path):
    _, art = _render(plan_name, target, smoke_test=True)
    assert art.primary in art.files
    for name, text in art.files.items():
        assert text.strip(), name
        if name.endswith(".sh") or name.endswith(".sbatch"):
            path = tmp_path / name
            path.write_text(text)
            out = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
            assert out.returncode == 0, out.stderr
        elif name.endswith(".yaml"):
            docs = list(yaml.safe_load_all(text))
            assert all(isinstance(d, dict) and d.get("apiVersion") and d.get("kind") for d in docs)
            for d in docs:
                if d["kind"] == "ConfigMap":
                    for key, script in d["data"].items():
                        if key.endswith(".sh"):
                            p = tmp_path / key
                            p.write_text(script)
                            assert subprocess.run(["bash", "-n", str(p)]).returncode == 0
        elif name.endswith(".json"):
            json.loads(text)
        elif name.endswith(".toml"):
            tomllib.loads(text)
        elif name.endswith(".py"):
            compile(text, name, "exec")


def _all_scripts(art, tmp_path: Path) -> list[Path]:
    paths = []
    for name, text in art.files.items():
        if name.endswith((".sh", ".sbatch")):
            p = tmp_path / name
            p.write_text(text)
            paths.append(p)
        elif name.endswith(".yaml"):
            for d in yaml.safe_load_all(text):
                if d["kind"] == "ConfigMap":
                    for key, script in d["data"].items():
                        if key.endswith(".sh"):
                            p = tmp_path / f"cm-{key}"
                            p.write_text(script)
                            paths.append(p)
    return paths


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
@pytest.mark.parametrize("plan_name", ["mixed", "interleaved"])
def test_shellcheck_clean(plan_name, tmp_path):
    paths = []
    for target in TARGETS:
        sub = tmp_path / target
        sub.mkdir()
        _, art = _render(plan_name, target, smoke_test=True)
        paths += _all_scripts(art, sub)
    assert paths
    out = subprocess.run(["shellcheck", "-s", "bash", *map(str, paths)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


# --- rank → host/GPU mapping, per target, by running the artifacts ----------------------------


def _hosts(plan):
    seen = []
    for r in sorted(plan["best"]["ranks"], key=lambda e: e["rank"]):
        if r["host"] not in seen:
            seen.append(r["host"])
    return seen


@pytest.mark.parametrize("plan_name", PLAN_NAMES)
@pytest.mark.parametrize(
    "target,script",
    [("torchrun", "launch_torchrun.sh"), ("megatron", "launch_megatron.sh"), ("torchtitan", "launch_torchtitan.sh"),
     ("paddle-launch", "launch_paddle.sh"), ("paddle-fleet", "launch_paddle.sh")],
)
def test_per_node_launchers_pin_every_rank(plan_name, target, script, tmp_path):
    plan, art = _render(plan_name, target)
    sim = Sim(tmp_path)
    # run the nodes in text order (node100, node66, node7, ...), not plan order
    got = sim.per_node_script(dict(art.files), script, sorted(_hosts(plan)))
    assert got == plan_mapping(plan)


@pytest.mark.parametrize("plan_name", PLAN_NAMES)
def test_torchrun_master_is_rank0_host_and_node_ranks_explicit(plan_name):
    plan, art = _render(plan_name, "torchrun")
    text = art.files["launch_torchrun.sh"]
    rank0 = plan_mapping(plan)[0][0]
    assert f"--master-addr={rank0} " in text
    assert "--rdzv-backend=static" in text and "c10d" not in text
    for k, host in enumerate(_hosts(plan)):
        block = text.split(f"  {host}|{host}.*)")[1].split(";;")[0]
        assert f"--node-rank={k} " in block


@pytest.mark.parametrize("plan_name", PLAN_NAMES)
def test_slurm_pins_every_rank(plan_name, tmp_path):
    plan, art = _render(plan_name, "slurm", smoke_test=True)
    sim = Sim(tmp_path)
    got = sim.slurm(dict(art.files))
    # the smoke step and the training step both start every rank
    assert got == plan_mapping(plan)


def test_slurm_hetjob_per_device_type():
    _, art = _render("mixed", "slurm")
    text = art.files["job.sbatch"]
    assert text.count("#SBATCH hetjob") == 1
    assert "#SBATCH --nodelist=node7,node8" in text and "#SBATCH --nodelist=node66,node100" in text
    assert "--het-group=1 --nodes=1 --ntasks=1 --nodelist=node66" in text
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert "SLURM_JOB_NODELIST" not in code and "SLURM_PROCID" not in code  # sorted hostlist never numbers ranks
    _, homog = _render("homogeneous", "slurm")
    assert "#SBATCH hetjob" not in homog.files["job.sbatch"] and "--het-group" not in homog.files["job.sbatch"]


@pytest.mark.parametrize("plan_name", PLAN_NAMES)
@pytest.mark.parametrize("target", ["deepspeed", "deepspeed-config"])
def test_deepspeed_pins_every_rank(plan_name, target, tmp_path):
    plan, art = _render(plan_name, target)
    hostfile = [line.split()[0] for line in art.files["hostfile"].splitlines() if line and not line.startswith("#")]
    assert hostfile == _hosts(plan)
    got = Sim(tmp_path).deepspeed(dict(art.files))
    assert got == plan_mapping(plan)


K8S = {
    "kubernetes-pytorchjob": ("pytorchjob.yaml", lambda job: {"MASTER_ADDR": f"{job}-master-0", "MASTER_PORT": "29500", "PET_NODE_RANK": "5"}),
    "kubernetes-paddlejob": ("paddlejob.yaml", lambda job: {"PADDLE_MASTER": f"{job}-worker-0:36543"}),
    "volcano": ("volcano-job.yaml", lambda job: {}),
    "kubeflow-trainjob": ("trainjob.yaml", lambda job: {"PET_MASTER_ADDR": f"{job}-node-0-0.{job}", "PET_MASTER_PORT": "29500", "PET_NODE_RANK": "0"}),
}


@pytest.mark.parametrize("plan_name", PLAN_NAMES)
@pytest.mark.parametrize("target", list(K8S))
def test_kubernetes_pins_every_rank(plan_name, target, tmp_path):
    plan, art = _render(plan_name, target)
    name, env = K8S[target]
    job = yaml.safe_load_all(art.files[name])
    job_name = [d for d in job if d["kind"] != "ConfigMap"][0]["metadata"]["name"]
    got, templates = Sim(tmp_path).kubernetes(art.files[name], env(job_name))
    assert got == plan_mapping(plan)
    hosts = [h for _, _, t in templates for h in affinity_hosts(t["spec"])]
    assert sorted(hosts) == sorted(_hosts(plan))  # every pod pinned, one per plan host
    for _, _, t in templates:
        anti = t["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
        assert anti["topologyKey"] == "kubernetes.io/hostname"
        assert anti["labelSelector"]["matchLabels"].items() <= t["metadata"]["labels"].items()
    if target in ("kubernetes-pytorchjob", "volcano"):  # the rendezvous master is pinned alone to rank 0's host
        master = [t for role, _, t in templates if role.lower() == "master"][0]
        assert affinity_hosts(master["spec"]) == [plan_mapping(plan)[0][0]]


def test_volcano_one_task_per_hardware_class():
    _, art = _render("mixed", "volcano")
    job = [d for d in yaml.safe_load_all(art.files["volcano-job.yaml"]) if d["kind"] == "Job"][0]
    names = [t["name"] for t in job["spec"]["tasks"]]
    assert names == ["master", "h100", "a100"]
    a100 = job["spec"]["tasks"][2]["template"]["spec"]
    assert sorted(affinity_hosts(a100)) == ["node100", "node66"]
    assert job["spec"]["minAvailable"] == 4 and job["spec"]["queue"] == "gpu"


def test_uneven_gpu_counts_work_per_class_and_fail_clearly_for_one_template(tmp_path):
    plan = uneven_gpu_plan()
    art = render(plan, "volcano", PARAMS)
    got, _ = Sim(tmp_path).kubernetes(art.files["volcano-job.yaml"], {})
    assert got == plan_mapping(plan)
    for target in ("kubernetes-pytorchjob", "kubernetes-paddlejob", "kubeflow-trainjob"):
        with pytest.raises(InvalidInput) as exc:
            render(plan, target, PARAMS)
        assert "different GPU counts" in exc.value.message and "node66" in exc.value.message


def test_gpu_product_affinity_when_cluster_has_gfd_labels():
    plan = mixed_plan()
    plan["cluster"]["node_groups"][1]["gpu_product"] = "NVIDIA-A100-SXM4-80GB"
    plan["cluster"]["node_groups"][0]["gpu_product"] = "NVIDIA-H100-80GB-HBM3"
    art = render(plan, "volcano", PARAMS)
    job = [d for d in yaml.safe_load_all(art.files["volcano-job.yaml"]) if d["kind"] == "Job"][0]
    exprs = job["spec"]["tasks"][2]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"]
    assert {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-A100-SXM4-80GB"]} in exprs


@pytest.mark.parametrize("plan_name", PLAN_NAMES)
def test_rankmap_json_and_csv_equal_plan(plan_name):
    plan, art = _render(plan_name, "rankmap")
    data = json.loads(art.files["rankmap.json"])
    assert {r["rank"]: (r["host"], r["gpu"]) for r in data["ranks"]} == plan_mapping(plan)
    rows = list(csv.DictReader(io.StringIO(art.files["rankmap.csv"])))
    assert {int(r["rank"]): (r["host"], int(r["gpu"])) for r in rows} == plan_mapping(plan)
    stages = {r["rank"]: r["stage"] for r in plan["best"]["ranks"]}
    assert {r["rank"]: r["stage"] for r in data["ranks"]} == stages
    # layers: stage s holds the plan's layer range
    lps = plan["best"]["strategy"]["layers_per_stage"]
    if len(lps) == plan["best"]["strategy"]["pp"]:
        starts = [sum(lps[:s]) for s in range(len(lps))]
        for r in data["ranks"]:
            assert r["layers"] == [starts[r["stage"]], starts[r["stage"]] + lps[r["stage"]] - 1]


# --- CRD schemas ---------------------------------------------------------------------------------


def _schema(name: str) -> dict:
    text = resources.files("planner_service").joinpath(f"reference/crds/{name}").read_text()
    return json.loads(text)["openAPIV3Schema"]


def _k8s_schema(schema):
    """Make Kubernetes' structural-schema extensions plain JSON Schema: int-or-string."""
    if isinstance(schema, dict):
        out = {k: _k8s_schema(v) for k, v in schema.items() if not k.startswith("x-kubernetes")}
        if schema.get("x-kubernetes-int-or-string"):
            out.pop("type", None)
            out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        return out
    if isinstance(schema, list):
        return [_k8s_schema(v) for v in schema]
    return schema


def _check_required(schema: dict, doc, path: str = "") -> None:
    """Walk the document: every ``required`` list of the schema holds for the objects present."""
    if not isinstance(schema, dict):
        return
    if isinstance(doc, dict):
        for key in schema.get("required", []):
            assert key in doc, f"{path}.{key} is required by the CRD"
        props = schema.get("properties", {})
        for key, value in doc.items():
            if key in props:
                _check_required(props[key], value, f"{path}.{key}")
            elif isinstance(schema.get("additionalProperties"), dict):
                _check_required(schema["additionalProperties"], value, f"{path}.{key}")
            elif props and not schema.get("x-kubernetes-preserve-unknown-fields"):
                raise AssertionError(f"{path}.{key} is not a field of the CRD schema")
    elif isinstance(doc, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(doc):
            _check_required(schema["items"], item, f"{path}[{i}]")


CRDS = {
    "kubernetes-pytorchjob": ("pytorchjob.yaml", {"PyTorchJob": "pytorchjob.v1.schema.json"}),
    "kubernetes-paddlejob": ("paddlejob.yaml", {"PaddleJob": "paddlejob.v1.schema.json"}),
    "volcano": ("volcano-job.yaml", {"Job": "volcano-job.v1alpha1.schema.json"}),
    "kubeflow-trainjob": (
        "trainjob.yaml",
        {"TrainJob": "trainjob.v1alpha1.schema.json", "TrainingRuntime": "clustertrainingruntime.v1alpha1.schema.json"},
    ),
}


@pytest.mark.parametrize("plan_name", ["homogeneous", "mixed"])
@pytest.mark.parametrize("target", list(CRDS))
def test_yaml_matches_crd_schema(plan_name, target):
    jsonschema = pytest.importorskip("jsonschema")
    name, kinds = CRDS[target]
    _, art = _render(plan_name, target, smoke_test=True)
    docs = list(yaml.safe_load_all(art.files[name]))
    checked = 0
    for doc in docs:
        if doc["kind"] not in kinds:
            assert doc["kind"] == "ConfigMap"
            assert doc["apiVersion"] == "v1" and "plan_node.sh" in doc["data"]
            assert set(doc["binaryData"]) == {"plan_nodes.tsv.gz", "rankmap.json.gz"}  # small plan: the map fits
            continue
        schema = _schema(kinds[doc["kind"]])
        ref = json.loads(resources.files("planner_service").joinpath(f"reference/crds/{kinds[doc['kind']]}").read_text())
        assert doc["apiVersion"] == ref["apiVersion"]
        jsonschema.validate(doc, _k8s_schema(schema))
        _check_required(schema, doc)
        checked += 1
    assert checked == len(kinds)


def test_crd_field_checker_catches_a_missing_required_field():
    _, art = _render("homogeneous", "kubernetes-pytorchjob")
    job = [d for d in yaml.safe_load_all(art.files["pytorchjob.yaml"]) if d["kind"] == "PyTorchJob"][0]
    del job["spec"]["pytorchReplicaSpecs"]
    with pytest.raises(AssertionError):
        _check_required(_schema("pytorchjob.v1.schema.json"), job)
    job2 = [d for d in yaml.safe_load_all(art.files["pytorchjob.yaml"]) if d["kind"] == "PyTorchJob"][0]
    job2["spec"]["nprocPerNode"] = 8  # must be a string in the CRD
    jsonschema = pytest.importorskip("jsonschema")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(job2, _k8s_schema(_schema("pytorchjob.v1.schema.json")))


def test_operator_conventions():
    _, art = _render("mixed", "kubernetes-pytorchjob")
    job = [d for d in yaml.safe_load_all(art.files["pytorchjob.yaml"]) if d["kind"] == "PyTorchJob"][0]
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert set(specs) == {"Master", "Worker"} and specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] == 3
    for s in specs.values():
        c = s["template"]["spec"]["containers"][0]
        assert c["name"] == "pytorch" and c["image"] and c["resources"]["limits"]["nvidia.com/gpu"] == 8
        assert c["ports"][0]["name"] == "pytorchjob-port"
    assert isinstance(job["spec"]["nprocPerNode"], str)
    _, art = _render("mixed", "kubernetes-paddlejob")
    pj = [d for d in yaml.safe_load_all(art.files["paddlejob.yaml"]) if d["kind"] == "PaddleJob"][0]
    assert set(pj["spec"]["paddleReplicaSpecs"]) == {"Worker"}
    assert pj["spec"]["paddleReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"] == "paddle"


# --- framework configs ---------------------------------------------------------------------------


def _megatron_args(text: str) -> list[str]:
    body = text.split("MEGATRON_ARGS=(", 1)[1].rsplit(")", 1)[0]
    import shlex

    return shlex.split(body, comments=True)


@pytest.mark.parametrize("plan_name", PLAN_NAMES)
def test_megatron_uses_only_megatron_argument_names(plan_name):
    plan, art = _render(plan_name, "megatron")
    words = _megatron_args(art.files["megatron_args.sh"])
    ref = megatron_reference()
    flags = [w for w in words if w.startswith("--")]
    assert flags
    for i, w in enumerate(words):
        if w.startswith("--"):
            assert w in ref, w
            takes_value = not ref[w].get("flag_only")
            nxt = words[i + 1] if i + 1 < len(words) else None
            assert takes_value == (nxt is not None and not nxt.startswith("--")), w
            if takes_value and ref[w].get("choices"):
                assert nxt in ref[w]["choices"]
    s = plan["best"]["strategy"]
    val = {w: words[i + 1] for i, w in enumerate(words) if w.startswith("--") and i + 1 < len(words) and not words[i + 1].startswith("--")}
    assert val["--tensor-model-parallel-size"] == str(s["tp"])
    assert val["--pipeline-model-parallel-size"] == str(s["pp"])
    assert val["--num-layers"] == str(sum(s["layers_per_stage"]))


def test_megatron_uneven_stages_use_pipeline_layout():
    _, art = _render("mixed", "megatron")
    words = _megatron_args(art.files["megatron_args.sh"])
    layout = words[words.index("--pipeline-model-parallel-layout") + 1]
    stages = layout.split("|")
    assert [s.count("t") for s in stages] == [20, 12]
    assert stages[0].startswith("E") and stages[-1].endswith("L")
    # interleaved: pp*vpp chunks, in model order, and no separate vpp flag
    _, art = _render("interleaved", "megatron")
    words = _megatron_args(art.files["megatron_args.sh"])
    layout = words[words.index("--pipeline-model-parallel-layout") + 1]
    assert [s.count("t") for s in layout.split("|")] == [9, 8, 7, 8]
    assert "--num-virtual-stages-per-pipeline-rank" not in words
    assert "--use-megatron-fsdp" in words  # zero_stage 3
    assert words[words.index("--ckpt-format") + 1] == "fsdp_dtensor"  # "Megatron FSDP only supports fsdp_dtensor"
    # even split: no layout
    _, art = _render("homogeneous", "megatron")
    words = _megatron_args(art.files["megatron_args.sh"])
    assert "--pipeline-model-parallel-layout" not in words and "--use-distributed-optimizer" in words
    assert words[words.index("--num-query-groups") + 1] == "8" and "--swiglu" in words
    assert megatron_layout((2, 1)) == "Ett|tL"
    assert megatron_layout((2, 1), mtp_layers=1) == "Ett|tmL"  # the MTP layer after the decoder, on the last stage


@pytest.mark.parametrize("plan_name", PLAN_NAMES)
def test_deepspeed_config_batch_identity(plan_name):
    plan, art = _render(plan_name, "deepspeed-config")
    cfg = json.loads(art.files["ds_config.json"])
    s = plan["best"]["strategy"]
    assert cfg["train_batch_size"] == cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * s["dp"]
    assert cfg["train_batch_size"] == plan["training"]["global_batch_size"]
    assert cfg["zero_optimization"]["stage"] == s["zero_stage"]
    parts = json.loads(art.files["pipeline_partition.json"])["parts"]
    assert parts[0] == 0 and parts[-1] == sum(s["layers_per_stage"]) + 2 and len(parts) == s["pp"] + 1


def test_deepspeed_overlap_comm_follows_the_costed_overlap():
    """``ds_config.json``'s ``overlap_comm`` is the plan's ``training.grad_reduce_overlap`` (what
    the cost model priced: the reduction overlapped with backward, DeepSpeed's double-buffered IPG
    bucket), not always on."""
    from helpers.plans import _ranks

    for overlap in (True, False, None):
        plan = ALL_PLANS["homogeneous"]()
        # without a pipeline (DeepSpeed's pipeline engine turns overlap_comm off: test below)
        plan["best"]["strategy"].update(zero_stage=1, pp=1, dp=4, layers_per_stage=[32])
        plan["best"]["ranks"] = _ranks(4, 4, 1, 1, lambda p, d, c, t: ("node7" if d < 2 else "node66", (d % 2) * 4 + t, "h100", "H100-SXM5-80GB"))
        plan["best"].pop("stages")
        if overlap is not None:
            plan["training"]["grad_reduce_overlap"] = overlap
        cfg = json.loads(render(plan, "deepspeed-config", PARAMS).files["ds_config.json"])
        assert cfg["zero_optimization"]["overlap_comm"] is (overlap is not False), overlap


def test_deepspeed_config_keys_are_deepspeeds_when_installed():
    consts = pytest.importorskip("deepspeed.runtime.constants")
    known = {v for v in vars(consts).values() if isinstance(v, str)}
    _, art = _render("mixed", "deepspeed-config")
    cfg = json.loads(art.files["ds_config.json"])
    # Sections DeepSpeedConfig reads by a literal key rather than a constant: zero_optimization,
    # activation_checkpointing, and "pipeline" (deepspeed.runtime.config.get_pipeline_config).
    sections = {"zero_optimization", "activation_checkpointing", "pipeline"}
    for key in cfg:
        assert key in known or key in sections, key
    if "pipeline" in cfg:
        from deepspeed.runtime.config import get_pipeline_config

        assert set(cfg["pipeline"]) <= set(get_pipeline_config({})), cfg["pipeline"]


@pytest.mark.parametrize("plan_name", PLAN_NAMES)
def test_paddle_fleet_config(plan_name):
    plan, art = _render(plan_name, "paddle-fleet")
    cfg = json.loads(art.files["fleet_strategy.json"])
    s = plan["best"]["strategy"]
    hc = cfg["hybrid_configs"]
    assert hc["mp_degree"] == s["tp"] and hc["pp_degree"] == s["pp"]
    assert hc["dp_degree"] * hc["sharding_degree"] == s["dp"]
    assert hc["order"][0] == "pp" and hc["order"][-1] == "mp"
    seg = cfg["seg_method"]
    total = sum(s["layers_per_stage"])
    assert seg[0] == 0 and seg[-1] == total + 2 and len(seg) == len(s["layers_per_stage"]) + 1
    assert [b - a for a, b in itertools.pairwise(seg)][1:-1] == s["layers_per_stage"][1:-1]
    assert cfg["pipeline_configs"]["accumulate_steps"] * cfg["pipeline_configs"]["micro_batch_size"] * s["dp"] == plan["training"]["global_batch_size"]


def test_paddle_fleet_strategy_accepts_config_when_installed(tmp_path):
    pytest.importorskip("paddle")
    _, art = _render("mixed", "paddle-fleet")
    (tmp_path / "fleet_strategy.json").write_text(art.files["fleet_strategy.json"])
    (tmp_path / "fleet_init.py").write_text(art.files["fleet_init.py"])
    import importlib.util

    spec = importlib.util.spec_from_file_location("fleet_init", tmp_path / "fleet_init.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    strategy = mod.build_strategy(mod.load_config(str(tmp_path / "fleet_strategy.json")))
    assert strategy.hybrid_configs["mp_degree"] == 2 and strategy.hybrid_configs["pp_degree"] == 2
    assert strategy.hybrid_configs["sharding_degree"] == 4  # zero_stage 1 → sharding over the dp ranks
    assert strategy.hybrid_parallel_order == ["pp", "dp", "sharding", "sep", "mp"]
    assert strategy.pipeline_configs["accumulate_steps"] == 16


@pytest.mark.parametrize("plan_name", PLAN_NAMES)
def test_torchtitan_toml(plan_name):
    plan, art = _render(plan_name, "torchtitan")
    cfg = tomllib.loads(art.files["torchtitan.toml"])
    s = plan["best"]["strategy"]
    par = cfg["parallelism"]
    assert par["tensor_parallel_degree"] == s["tp"] and par["pipeline_parallel_degree"] == s["pp"]
    assert par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"] == s["dp"]
    parts = par["module_fqns_per_model_part"]
    assert [sum(1 for m in p if m.startswith("layers.")) for p in parts] == s["layers_per_stage"]
    flat = [m for p in parts for m in p if m.startswith("layers.")]
    assert flat == [f"layers.{i}" for i in range(sum(s["layers_per_stage"]))]
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]
    assert par["pipeline_parallel_schedule"] == ("Interleaved1F1B" if s["vpp"] > 1 else "1F1B")


# --- NCCL, smoke test, parameters, errors ------------------------------------------------------------


def test_nccl_env_from_cluster_and_debug_default():
    _, art = _render("mixed", "torchrun")
    text = art.files["launch_torchrun.sh"]
    node7 = text.split("  node7|node7.*)")[1].split(";;")[0]
    node66 = text.split("  node66|node66.*)")[1].split(";;")[0]
    assert "NCCL_SOCKET_IFNAME=ib" in node7 and "NCCL_IB_HCA=mlx5" in node7
    assert "NCCL_SOCKET_IFNAME=eth" in node66 and "NCCL_IB_HCA" not in node66
    assert "NCCL_DEBUG=WARN" in node7
    _, art = _render("mixed", "torchrun", nccl_debug="INFO", env={"WANDB_MODE": "offline"})
    assert "NCCL_DEBUG=INFO" in art.files["launch_torchrun.sh"] and "WANDB_MODE=offline" in art.files["launch_torchrun.sh"]


def test_smoke_test_runs_before_training(tmp_path):
    plan, art = _render("homogeneous", "torchrun", smoke_test=True)
    assert "nccl_smoke.py" in art.files
    block = art.files["launch_torchrun.sh"].split("  node7|node7.*)")[1].split(";;")[0]
    assert block.index("nccl_smoke.py") < block.index("train.py")
    compile(art.files["nccl_smoke.py"], "nccl_smoke.py", "exec")
    _, art = _render("homogeneous", "torchrun", smoke_test=False)
    assert "nccl_smoke.py" not in art.files and "nccl_smoke" not in art.files["launch_torchrun.sh"]


def test_remap_only_when_needed():
    _, art = _render("homogeneous", "torchrun")
    assert "plan_rank.sh" not in art.files
    _, art = _render("interleaved", "torchrun")
    assert "plan_rank.sh" in art.files


@pytest.mark.parametrize(
    "mutate,field",
    [
        (lambda p: p["best"].pop("ranks"), "plan.best.ranks"),
        (lambda p: p["best"]["ranks"].pop(), "plan.best.ranks"),
        (lambda p: p["best"]["ranks"][3].update(gpu=p["best"]["ranks"][2]["gpu"]), "plan.best.ranks[3].gpu"),
        (lambda p: p["best"]["ranks"][1].update(host="bad host;rm"), "plan.best.ranks[1].host"),
        (lambda p: p["best"]["ranks"][1].update(host=["node0"]), "plan.best.ranks[1].host"),
        (lambda p: p["best"]["ranks"].__setitem__(4, [4]), "plan.best.ranks[4]"),
        (lambda p: p["best"]["ranks"][5].update(tp=3), "plan.best.ranks[5].tp"),
        (lambda p: p["best"]["strategy"].update(layers_per_stage=[1, 2, 3]), "plan.best.strategy.layers_per_stage"),
        (lambda p: p["best"]["strategy"].update(tp=0), "plan.best.strategy.tp"),
    ],
)
def test_bad_plans_name_the_field(mutate, field):
    plan = homogeneous_plan()
    mutate(plan)
    with pytest.raises(InvalidInput) as exc:
        render(plan, "megatron", PARAMS)
    assert exc.value.field == field


@pytest.mark.parametrize(
    "kw,field",
    [({"job_name": "Bad_Name"}, "job_name"), ({"env": {"1X": "a"}}, "env"), ({"command": "train.py 'unterminated"}, "command"),
     ({"queue": "a b"}, "queue"), ({"image": None}, "image")],
)
def test_bad_params_name_the_field(kw, field):
    with pytest.raises(InvalidInput) as exc:
        render(homogeneous_plan(), "volcano", LaunchParams(**{**PARAMS.__dict__, **kw}))
    assert exc.value.field == field


def test_unknown_target():
    with pytest.raises(InvalidInput) as exc:
        render(homogeneous_plan(), "mpirun", PARAMS)
    assert exc.value.field == "target"


def test_framework_target_without_layers_is_a_clear_error():
    plan = homogeneous_plan()
    plan["best"]["strategy"].pop("layers_per_stage")
    plan["best"].pop("stages")
    plan["model"].pop("spec")
    assert render(plan, "torchrun", PARAMS).files  # launchers need no layers
    with pytest.raises(InvalidInput) as exc:
        render(plan, "megatron", PARAMS)
    assert "layer" in exc.value.message


def test_graph_model_plans_refuse_framework_targets_but_launch():
    plan = homogeneous_plan()
    plan["model"] = {"name": "onnx-net", "params": 1000, "spec": {"model_id": "abc"}}
    assert render(plan, "slurm", PARAMS).files and render(plan, "rankmap", PARAMS).files
    for target in ("megatron", "torchtitan", "paddle-fleet"):
        with pytest.raises(InvalidInput) as exc:
            render(plan, target, PARAMS)
        assert exc.value.field == "target" and "operator-graph" in exc.value.message


def test_launch_params_builder_shared_by_route_and_cli():
    from cost_model.errors import InvalidInput
    from planner_service.exporters import launch_params

    p = launch_params(image="img:1", namespace=None, master_port=None, env=["A=1", "B=x=y"], smoke_test=True)
    assert p == LaunchParams(image="img:1", env={"A": "1", "B": "x=y"}, smoke_test=True)  # None: the default
    assert launch_params() == LaunchParams()
    with pytest.raises(InvalidInput) as e:
        launch_params(env=["NOEQUALS"])
    assert e.value.field == "env"


def test_megatron_launch_exports_what_megatron_asserts_for_tensor_parallelism(tmp_path):
    """Megatron-LM's validate_args asserts CUDA_DEVICE_MAX_CONNECTIONS=1 with TP or CP before
    Blackwell: the homogeneous plan (tp 4, H100) exports it on every node and says why; without
    model parallelism, under Megatron-FSDP, on Blackwell, or where the user set it, it is left alone."""
    plan, art = _render("homogeneous", "megatron")
    launch = art.files["launch_megatron.sh"]
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in launch
    assert any("CUDA_DEVICE_MAX_CONNECTIONS=1" in n and "Blackwell" in n for n in art.notes)

    def variant(**strategy):
        p = json.loads(json.dumps(plan))
        p["best"]["strategy"].update(strategy)
        return p

    def exported(p, **kw):
        files = render(p, "megatron", LaunchParams(**{**PARAMS.__dict__, **kw})).files
        return [line.strip() for line in files["launch_megatron.sh"].splitlines() if "CUDA_DEVICE_MAX_CONNECTIONS" in line]

    no_tp = variant(tp=1, dp=8, sequence_parallel=False)
    for r in no_tp["best"]["ranks"]:
        r["tp"], r["dp"] = 0, r["dp"] * 4 + r["tp"]
    assert exported(no_tp) == []
    assert exported(variant(zero_stage=3)) == []  # Megatron-FSDP: a warning in Megatron, not an assert
    blackwell = json.loads(json.dumps(plan).replace("H100-SXM5-80GB", "B200-HGX-180GB"))
    assert exported(blackwell) == []
    user = exported(plan, env={"CUDA_DEVICE_MAX_CONNECTIONS": "8"})
    assert user and all(line.endswith("CUDA_DEVICE_MAX_CONNECTIONS=8") for line in user)
    assert exported(plan) and all(line.endswith("CUDA_DEVICE_MAX_CONNECTIONS=1") for line in exported(plan))
    # every launcher of the plan carries it: Slurm's job script, DeepSpeed's runner for Megatron-DeepSpeed
    assert " CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun " in render(plan, "slurm", PARAMS).files["job.sbatch"]
    mds = json.loads(json.dumps(plan))
    mds["training"]["framework"] = "megatron-deepspeed"
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1\n" in render(mds, "deepspeed", PARAMS).files[".deepspeed_env"]
    fsdp = json.loads(json.dumps(plan))
    fsdp["training"]["framework"] = "fsdp"
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in render(fsdp, "torchtitan", PARAMS).files["launch_torchtitan.sh"]


def test_deepspeed_config_follows_the_pipeline_engine():
    """DeepSpeed's pipeline engine turns overlap_comm off and refuses ZeRO 2/3: the config says
    overlap_comm false with pp > 1, and a stage-2 pipeline plan is a 422 naming the target."""
    from planner_service.exporters.plan_view import InvalidPlan

    plan = homogeneous_plan()  # pp 2
    plan["training"]["framework"] = "megatron-deepspeed"
    cfg = json.loads(render(plan, "deepspeed-config", PARAMS).files["ds_config.json"])
    assert cfg["zero_optimization"] == {"stage": 1, "overlap_comm": False, "contiguous_gradients": True}
    plan["best"]["strategy"]["zero_stage"] = 2
    with pytest.raises(InvalidPlan) as exc:
        render(plan, "deepspeed-config", PARAMS)
    assert exc.value.field == "target" and "ZeRO stage 0-1" in str(exc.value)


def test_torchtitan_launch_of_a_zero2_pipeline_plan_says_what_torchtitan_runs_instead():
    """torch.distributed.pipelining turns FSDP's gradient sync off until a stage's last backward,
    so a plan costed as ZeRO 2 across a pipeline (the Llama 3 paper's layout) is launched with
    the note that torchtitan keeps the gradients unsharded; ZeRO 3 (what the plan then costs as
    torchtitan runs it: layer_cost.pipelined_fsdp) needs none."""
    from helpers.plans import homogeneous_plan

    def notes(zero: int) -> str:
        plan = homogeneous_plan()
        plan["training"]["framework"] = "fsdp"
        plan["best"]["strategy"]["zero_stage"] = zero
        return " ".join(render(plan, "torchtitan", PARAMS).notes)

    assert "gradients unsharded in fp32" in notes(2) and "plan with zero_stage 3" in notes(2)
    assert "gradients unsharded" not in notes(3)


def test_fsdp_launches_set_expandable_segments_as_torchtitans_runner_does():
    """torchtitan's run_train.sh launches with PYTORCH_ALLOC_CONF=expandable_segments:True; every
    launcher of an fsdp plan carries it (the user's env wins), other frameworks' do not."""
    from helpers.plans import homogeneous_plan

    plan = homogeneous_plan()
    plan["training"]["framework"] = "fsdp"
    for target, name in (("torchtitan", "launch_torchtitan.sh"), ("slurm", "job.sbatch")):
        assert "PYTORCH_ALLOC_CONF=expandable_segments:True" in render(plan, target, PARAMS).files[name]
    mine = LaunchParams(image=PARAMS.image, command=PARAMS.command, queue=PARAMS.queue, smoke_test=False,
                        env={"PYTORCH_ALLOC_CONF": "expandable_segments:False"})
    assert "expandable_segments:True" not in render(plan, "torchtitan", mine).files["launch_torchtitan.sh"]
    assert "PYTORCH_ALLOC_CONF" not in render(homogeneous_plan(), "slurm", PARAMS).files["job.sbatch"]


@pytest.mark.parametrize(("target", "script"), [("torchtitan", "launch_torchtitan.sh"), ("megatron", "launch_megatron.sh")])
def test_the_run_on_every_node_note_names_the_script_written(target, script):
    """Targets that wrap the torchrun launcher write its script under their own name; the note
    telling the user what to run on every node names that file, not torchrun's."""
    from helpers.plans import homogeneous_plan

    plan = homogeneous_plan()
    plan["training"]["framework"] = "fsdp" if target == "torchtitan" else "megatron-core"
    art = render(plan, target, PARAMS)
    assert script in art.files and "launch_torchrun.sh" not in art.files
    assert any(f"run {script} on every node" in n for n in art.notes)
    assert not any("launch_torchrun.sh" in n for n in art.notes)
