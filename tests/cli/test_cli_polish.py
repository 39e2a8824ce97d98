"""CLI polish (issue 16): help a person reads, the per-user default database, and the
server URL of `planner launch ID`."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from planner_service.settings import ServiceSettings


def _commands(cmd, prefix=()):
    subs = getattr(cmd, "commands", None) or {}
    if not subs:
        yield prefix
    for name, sub in subs.items():
        yield from _commands(sub, (*prefix, name))


def test_help_shows_metavars_not_python_types(cli):
    paths = list(_commands(typer.main.get_command(cli)))
    assert ("launch",) in paths and ("cluster", "import") in paths
    for path in [(), *paths]:
        res = CliRunner().invoke(cli, [*path, "--help"], terminal_width=200, prog_name="planner")
        assert res.exit_code == 0, (path, res.output)
        assert not re.search(r"<(bool|str|int|float|path|list\[[^\]]*\])>", res.output), (path, res.output)
    out = CliRunner().invoke(cli, ["launch", "--help"], terminal_width=200).output
    assert "ID|FILE" in out and "URL" in out and "KEY=VALUE" in out
    assert "FILE" in CliRunner().invoke(cli, ["cluster", "import", "--help"], terminal_width=200).output


def test_default_database_is_per_user_under_the_xdg_data_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("PLANNER_DATABASE_URL", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert ServiceSettings().database_url == f"sqlite:///{tmp_path / 'data' / 'planner' / 'planner.db'}"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert ServiceSettings().database_url == f"sqlite:///{tmp_path / 'home' / '.local' / 'share' / 'planner' / 'planner.db'}"
    monkeypatch.setenv("DATABASE_URL", "sqlite:////elsewhere/x.db")
    assert ServiceSettings().database_url == "sqlite:////elsewhere/x.db"


def test_db_upgrade_from_any_directory_uses_the_same_database(cli, monkeypatch, tmp_path):
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("PLANNER_DATABASE_URL", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    res = CliRunner().invoke(cli, ["db", "upgrade"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "data" / "planner" / "planner.db").is_file()
    assert not (tmp_path / "elsewhere" / "planner.db").exists()


def test_launch_by_id_without_a_server_says_how(cli, monkeypatch):
    monkeypatch.delenv("PLANNER_SERVER_URL", raising=False)
    res = CliRunner().invoke(cli, ["launch", "0b6c3f0e-1111-2222-3333-444455556666", "--target", "torchrun"])
    assert res.exit_code == 2
    assert "PLANNER_SERVER_URL" in res.output and "--server" in res.output


def _shape(value):
    """Keys all the way down (lists by their first item): the object's shape, not its values."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    return type(value).__name__ if value is not None else None


def test_plan_and_estimate_json_are_the_http_objects(cli, make_client, tmp_path):
    import json

    from helpers.requests import small_request

    body = small_request()
    (tmp_path / "req.json").write_text(json.dumps(body))
    res = CliRunner().invoke(cli, ["plan", str(tmp_path / "req.json"), "--json"])
    assert res.exit_code == 0, res.output
    printed = json.loads(res.stdout)
    client = make_client(start_worker=False)
    posted = client.post("/v1/plans", json=body).json()
    assert set(printed) == set(posted)
    assert printed["id"] is None and printed["request_hash"] == posted["request_hash"]
    for key in ("best", "summary", "model", "search"):
        assert set(printed[key]) == set(posted[key]), key
    assert printed["best"]["strategy"] == posted["best"]["strategy"]

    est = {"model": body["model"], "training": body["training"], "cluster": body["cluster"],
           "strategy": {"dp": 1, "tp": 1, "pp": 1, "micro_batch_size": 1}}
    (tmp_path / "est.json").write_text(json.dumps(est))
    (tmp_path / "est.jsonl").write_text(json.dumps(est) + "\n")
    one = json.loads(CliRunner().invoke(cli, ["estimate", str(tmp_path / "est.json"), "--json"]).stdout)
    line = json.loads(CliRunner().invoke(cli, ["estimate", "--batch", str(tmp_path / "est.jsonl"), "--json"]).stdout.splitlines()[0])
    http = client.post("/v1/estimate", json=est).json()
    assert set(one) == set(http) == set(line)


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["plan", "/nonexistent/req.json"], 2),  # unreadable file: bad input
        (["estimate", "{bad}"], 2),  # a request with a bad field (written by the test)
        (["plan", "{bad}", "--json"], 2),
        (["launch", "{plan}", "--target", "no-such-target"], 2),
        (["launch", "abc", "--target", "torchrun", "--server", "http://127.0.0.1:9"], 1),  # server unreachable: a run-time failure
        (["cluster", "import", "--format", "nvidia-smi", "/nonexistent/node.csv"], 2),
    ],
)
def test_exit_codes_as_documented(cli, tmp_path, args, code):
    """README: 0 success, 2 bad input (the message names the field), 1 other failures."""
    import json

    (tmp_path / "bad.json").write_text(json.dumps({"model": {"preset": "no-such-model"}, "training": {}, "cluster": {}}))
    (tmp_path / "plan.json").write_text(json.dumps({"best": None}))
    args = [a.replace("{bad}", str(tmp_path / "bad.json")).replace("{plan}", str(tmp_path / "plan.json")) for a in args]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == code, res.output


def test_an_onnx_plan_under_a_framework_that_cannot_run_the_pin_exits_2_naming_it(cli, tmp_path):
    """`planner plan --onnx` holds the graph to training.framework: DeepSpeed alone shards no
    operator, so a pinned tp is bad input (exit 2) and the message names constraints.tp."""
    import json

    from helpers.graphs import mlp_onnx

    onnx_path = mlp_onnx(str(tmp_path / "mlp.onnx"), layers=2, width=64)
    body = {"training": {"global_batch_size": 256, "sequence_length": 1, "framework": "deepspeed"},
            "cluster": {"name": "one", "node_groups": [{"name": "g", "count": 1, "gpus_per_node": 8, "device": "A100-SXM4-80GB"}]}}
    (tmp_path / "req.json").write_text(json.dumps({**body, "constraints": {"tp": 2}}))
    res = CliRunner().invoke(cli, ["plan", str(tmp_path / "req.json"), "--onnx", onnx_path], terminal_width=200)
    assert res.exit_code == 2 and "constraints.tp" in res.output and "deepspeed" in res.output, res.output
    (tmp_path / "ok.json").write_text(json.dumps(body))
    res = CliRunner().invoke(cli, ["plan", str(tmp_path / "ok.json"), "--onnx", onnx_path, "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["best"]["strategy"]["tp"] == 1


def test_estimate_prints_the_step_interval_and_why_it_is_wide(cli, tmp_path):
    """The table's step time carries its p10–p90 interval and regime; a DeepSpeed ZeRO-3 step,
    whose stage-3 constants one source informs, is printed with the interval that spans their
    priors and the warning that says so (the same figures as the JSON)."""
    import json

    est = {"model": {"preset": "llama2-7b"}, "training": {"global_batch_size": 32, "sequence_length": 4096, "framework": "deepspeed"},
           "cluster": {"name": "c", "node_groups": [{"name": "g", "count": 1, "gpus_per_node": 8, "device": "A100-SXM4-80GB"}]},
           "strategy": {"dp": 8, "zero_stage": 3, "micro_batch_size": 4, "recompute": "full"}}
    (tmp_path / "est.json").write_text(json.dumps(est))
    as_json = json.loads(CliRunner().invoke(cli, ["estimate", str(tmp_path / "est.json"), "--json"]).stdout)
    res = CliRunner().invoke(cli, ["estimate", str(tmp_path / "est.json")], terminal_width=400)
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert f"p10–p90 {as_json['step_time_s_p10']:.4g}–{as_json['step_time_s_p90']:.4g} s, regime {as_json['interval_regime']}" in text
    assert "fitted on a single source" in text and "Narayanan2021_Table2" in text


def test_estimate_names_hierarchical_context_parallelism_and_refuses_a_level_that_does_not_divide_cp(cli, tmp_path):
    import json

    est = {"model": {"preset": "llama3-8b"},
           "training": {"global_batch_size": 8, "sequence_length": 131072, "cp_comm_type": "a2a+p2p", "cp_a2a_size": 4},
           "cluster": {"name": "c", "node_groups": [{"name": "g", "count": 2, "gpus_per_node": 8, "device": "H100-SXM5-80GB"}]},
           "strategy": {"tp": 2, "cp": 8, "dp": 1, "sequence_parallel": True, "recompute": "full", "micro_batch_size": 1}}
    (tmp_path / "est.json").write_text(json.dumps(est))
    res = CliRunner().invoke(cli, ["estimate", str(tmp_path / "est.json")], terminal_width=400)
    assert res.exit_code == 0, res.output
    assert "cp 8 (all-to-all over 4 inside a ring of 2)" in " ".join(res.output.split())
    est["training"]["cp_a2a_size"] = 3
    (tmp_path / "est.json").write_text(json.dumps(est))
    res = CliRunner().invoke(cli, ["estimate", str(tmp_path / "est.json")], terminal_width=400)
    assert res.exit_code == 2 and "strategy.cp" in res.output and "3 does not divide 8" in " ".join(res.output.split())


@pytest.mark.parametrize(
    ("command", "extra", "field", "says"),
    [
        ("plan", {"strategy": {"tp": 2}}, "strategy", "constraints"),  # an estimate's pins copied into a plan
        ("plan", {"async": True}, "async", "POST /v1/plans"),  # how the service queues a plan: not the CLI's
        ("plan", {"colour": "red"}, "colour", "model, training, cluster"),
        ("estimate", {"constraints": {"tp": 2}}, "constraints", "strategy"),
    ],
)
def test_a_top_level_field_the_request_does_not_read_exits_2_naming_it(cli, tmp_path, command, extra, field, says):
    """A field the parser would not read is refused, not dropped: a ``strategy`` in a plan
    request would otherwise leave every knob it pins to the search."""
    import json

    from helpers.requests import SMALL_REQUEST

    body = {**SMALL_REQUEST, **({"strategy": {"dp": 8}} if command == "estimate" else {}), **extra}
    (tmp_path / "req.json").write_text(json.dumps(body))
    res = CliRunner().invoke(cli, [command, str(tmp_path / "req.json")], terminal_width=200)
    assert res.exit_code == 2, res.output
    said = " ".join(res.output.split())
    assert f"error ({field})" in said and says in said, res.output


def test_recompute_modules_through_the_cli_estimate_and_plan(cli, tmp_path):
    """Megatron-Core's recompute modules as a strategy field of `planner estimate` (its table
    says them) and a pin of `planner plan` (the plan's strategy carries them); another
    framework's request exits 2 naming the field."""
    import json

    cluster = {"name": "c", "node_groups": [{"name": "g", "count": 2, "gpus_per_node": 8, "device": "H100"}]}
    training = {"global_batch_size": 64, "sequence_length": 4096}
    strategy = {"dp": 4, "tp": 2, "pp": 2, "ep": 4, "sequence_parallel": True, "recompute": "selective", "recompute_modules": ["moe_act", "layernorm"]}
    (tmp_path / "est.json").write_text(json.dumps({"model": {"preset": "mixtral-8x7b"}, "training": training, "cluster": cluster, "strategy": strategy}))
    table = CliRunner().invoke(cli, ["estimate", str(tmp_path / "est.json")])
    assert table.exit_code == 0, table.output
    assert "selective recompute (moe_act, layernorm)" in " ".join(table.output.split())
    body = {"model": {"preset": "mixtral-8x7b"}, "training": training, "cluster": cluster, "top_k": 0,
            "constraints": {k: strategy[k] for k in ("tp", "pp", "ep", "recompute_modules")}}
    (tmp_path / "plan.json").write_text(json.dumps(body))
    res = CliRunner().invoke(cli, ["plan", str(tmp_path / "plan.json"), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["best"]["strategy"]["recompute_modules"] == ["moe_act", "layernorm"]
    (tmp_path / "fsdp.json").write_text(json.dumps({**body, "training": {**training, "framework": "fsdp"}}))
    bad = CliRunner().invoke(cli, ["plan", str(tmp_path / "fsdp.json")])
    assert bad.exit_code == 2 and "constraints.recompute_modules" in bad.output
