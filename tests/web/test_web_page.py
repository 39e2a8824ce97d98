"""The web page is served by the app itself: GET / and its assets, with the right types and
caching, nothing loaded from elsewhere, and the script only refers to elements that exist."""

from __future__ import annotations

import dataclasses
import html
import json
import re
import tomllib
from html.parser import HTMLParser
from importlib import resources
from pathlib import Path

from cost_model.frameworks import describe
from cost_model.strategy import RECOMPUTE, RECOMPUTE_METHODS
from cost_model.training import (
    ATTENTION_IMPLS,
    CP_COMM_TYPES,
    FRAMEWORKS,
    GRAD_ACCUM_DTYPES,
    MOE_DISPATCHERS,
    OPTIMIZER_DTYPES,
    OPTIMIZERS,
    Training,
)
from planner_service.api.routes.web import ASSETS
from planner_service.exporters import TARGETS
from planner_service.planner.request import PINNABLE, TIGHT_MEMORY

REPO = Path(__file__).resolve().parents[2]
WEB = resources.files("planner_service") / "web"


def test_root_serves_the_page_with_its_assets_and_the_launch_targets(web_client):
    r = web_client.get("/")
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/html; charset=utf-8"
    page = r.text
    assert "<title>Auto-parallel planner</title>" in page
    assert '<script src="/static/app.js" defer></script>' in page
    assert '<link rel="stylesheet" href="/static/style.css">' in page
    targets = re.search(r'<meta name="planner-launch-targets" content="([^"]*)">', page).group(1)
    assert targets.split(",") == list(TARGETS)
    assert "__LAUNCH_TARGETS__" not in page
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "connect-src 'self'" in csp


def test_assets_have_their_content_types_and_contents(web_client):
    expected = {"app.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}
    assert expected == ASSETS
    for name, ctype in expected.items():
        r = web_client.get(f"/static/{name}")
        assert r.status_code == 200, name
        assert r.headers["content-type"] == ctype
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.content == (WEB / name).read_bytes()


def test_unknown_assets_and_paths_outside_the_web_folder_are_404_with_the_error_body(web_client):
    for path in ("/static/nope.js", "/static/index.html", "/static/..%2Fapi%2Fapp.py", "/static/%2E%2E/pyproject.toml"):
        r = web_client.get(path)
        assert r.status_code == 404, path
        assert r.json()["error"]["code"] == "not_found"
    r = web_client.get("/static/..%2F..%2Fpyproject.toml")
    assert r.status_code == 404


def test_etag_revalidation_and_head(web_client):
    for path in ("/", "/static/app.js", "/static/style.css"):
        first = web_client.get(path)
        etag = first.headers["etag"]
        assert first.headers["cache-control"] == "no-cache"
        again = web_client.get(path, headers={"If-None-Match": etag})
        assert again.status_code == 304 and again.content == b""
        other = web_client.get(path, headers={"If-None-Match": '"something-else"'})
        assert other.status_code == 200 and other.content == first.content
        head = web_client.head(path)
        assert head.status_code == 200 and head.headers["etag"] == etag


def test_web_routes_stay_out_of_the_api_schema(web_client):
    paths = web_client.get("/openapi.json").json()["paths"]
    assert "/" not in paths and not any(p.startswith("/static") for p in paths)
    assert "/v1/plans" in paths


def test_page_loads_nothing_from_other_origins():
    for name in ("index.html", "app.js", "style.css"):
        text = (WEB / name).read_text()
        assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text), name
        assert not re.search(r"""\burl\(\s*["']?(https?:)?//""", text), name
        assert not re.search(r"""fetch\(\s*["'`]https?:""", text), name
        assert "@import" not in text, name


def test_every_element_the_script_looks_up_by_id_exists():
    page = (WEB / "index.html").read_text()
    script = (WEB / "app.js").read_text()
    page_ids = set(re.findall(r'\bid="([^"]+)"', page))
    made_ids = set(re.findall(r'\bid: "([^"]+)"', script))
    looked_up = set(re.findall(r'\$\("#([A-Za-z0-9_-]+)', script))
    assert looked_up, "the id pattern no longer matches the script"
    assert looked_up <= page_ids | made_ids, sorted(looked_up - page_ids - made_ids)


def test_every_form_control_has_a_label():
    page = (WEB / "index.html").read_text()
    for m in re.finditer(r"<(input|select|textarea)\b([^>]*)>", page):
        attrs = m.group(2)
        ident = re.search(r'\bid="([^"]+)"', attrs)
        wrapped = page.rfind("<label", 0, m.start()) > page.rfind("</label>", 0, m.start())
        labelled_for = ident is not None and f'for="{ident.group(1)}"' in page
        assert wrapped or labelled_for or "aria-label=" in attrs, m.group(0)


def test_package_data_ships_the_web_folder():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "web/*" in config["tool"]["setuptools"]["package-data"]["planner_service"]
    for name in ("index.html", "app.js", "style.css"):
        assert (REPO / "planner_service" / "web" / name).is_file()


class _Controls(HTMLParser):
    """Every input/select/textarea of the page: its attributes, and a select's option values."""

    def __init__(self) -> None:
        super().__init__()
        self.controls: list[dict] = []
        self._select: dict | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("input", "select", "textarea"):
            self.controls.append({"tag": tag, **a, "options": []})
            if tag == "select":
                self._select = self.controls[-1]
        elif tag == "option" and self._select is not None:
            self._select["options"].append(a.get("value"))

    def handle_endtag(self, tag):
        if tag == "select":
            self._select = None


def _page_controls() -> dict[str, dict]:
    parser = _Controls()
    parser.feed((WEB / "index.html").read_text())
    return {c["data-field"]: c for c in parser.controls if c.get("data-field")}


def test_framework_select_offers_exactly_the_contracts_frameworks_default_first(web_client):
    select = _page_controls()["training.framework"]
    assert select["tag"] == "select"
    assert tuple(select["options"]) == FRAMEWORKS
    # the per-framework hints name only frameworks the contract has: the server writes them into
    # the page from the rule table the search applies
    page = web_client.get("/").text
    content = re.search(r'<meta name="planner-frameworks" content="([^"]*)">', page).group(1)
    hints = json.loads(html.unescape(content))
    assert sorted(hints) == sorted(FRAMEWORKS)
    assert all(hints[f] == describe(f) for f in FRAMEWORKS)


def test_constraints_fieldset_pins_every_pinnable_knob_with_the_contracts_values():
    controls = _page_controls()
    fields = {k.removeprefix("constraints."): c for k, c in controls.items() if k.startswith("constraints.")}
    limits = {"max_tp", "max_pp", "max_devices", "memory_headroom_fraction", "tight_memory"}
    # every pinnable knob has a control, and every control names a constraint the server knows
    assert set(PINNABLE) <= set(fields), sorted(set(PINNABLE) - set(fields))
    assert set(fields) <= set(PINNABLE) | limits | {"allowed_device_types"}, sorted(set(fields) - set(PINNABLE) - limits)
    # each control's id is the one the script reads
    script = (WEB / "app.js").read_text()
    for c in fields.values():
        assert f'"#{c["id"]}"' in script, c["id"]
    # the choices are the contract's; "" (not pinned) leaves the key out
    assert fields["recompute"]["options"] == ["", *RECOMPUTE]
    assert fields["recompute_method"]["options"] == ["", *RECOMPUTE_METHODS]
    assert fields["zero_stage"]["options"] == ["", "0", "1", "2", "3"]
    assert fields["tight_memory"]["options"][0] == "" and set(fields["tight_memory"]["options"][1:]) <= set(TIGHT_MEMORY)
    for flag in ("sequence_parallel", "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"):
        assert fields[flag]["options"] == ["", "true", "false"], flag
    for knob in ("dp", "tp", "pp", "cp", "ep", "vpp", "micro_batch_size", "recompute_num_layers", "dp_shard"):
        assert fields[knob]["tag"] == "input" and fields[knob]["type"] == "number", knob


def _training_choices() -> dict[str, tuple[str, str]]:
    """The script's TRAINING_CHOICES: {training key: (element id, default as the select's value)}."""
    script = (WEB / "app.js").read_text()
    block = re.search(r"const TRAINING_CHOICES = \[(.*?)\n  \];", script, re.S).group(1)
    rows = re.findall(r'\["#([\w-]+)", "(\w+)", "([^"]*)",', block)
    assert rows, "the TRAINING_CHOICES pattern no longer matches the script"
    return {key: (ident, default) for ident, key, default in rows}


def test_training_options_offer_the_contracts_choices_with_its_defaults():
    controls = _page_controls()
    fields = {k.removeprefix("training."): c for k, c in controls.items() if k.startswith("training.")}
    # every Training field of the contract has a control (total_tokens lives with the objective)
    contract = {f.name for f in dataclasses.fields(Training)}
    assert contract <= set(fields), sorted(contract - set(fields))
    assert set(fields) <= contract, sorted(set(fields) - contract)
    # the choices are exactly the contract's, its default first
    assert tuple(fields["attention"]["options"]) == ATTENTION_IMPLS
    assert tuple(fields["optimizer"]["options"]) == OPTIMIZERS
    assert tuple(fields["moe_token_dispatcher"]["options"]) == MOE_DISPATCHERS
    assert fields["cp_comm_type"]["options"] == ["", *CP_COMM_TYPES]  # "": the framework's own, omitted
    assert fields["grad_accum_dtype"]["options"] == ["", *GRAD_ACCUM_DTYPES]  # "": DeepSpeed's default, omitted
    defaults = {f.name: f.default for f in dataclasses.fields(Training)}
    assert fields["attention"]["options"][0] == defaults["attention"]
    assert fields["moe_token_dispatcher"]["options"][0] == defaults["moe_token_dispatcher"]
    assert defaults["cp_comm_type"] is None and defaults["grad_accum_dtype"] is None
    for key, choices in OPTIMIZER_DTYPES.items():  # Megatron-Core's optimizer precision, fp32 first
        assert tuple(fields[key]["options"]) == choices and defaults[key] == choices[0], key
    for flag in ("tp_comm_overlap", "grad_reduce_overlap", "fused_kernels", "moe_comm_overlap", "precision_aware_optimizer", "master_weights",
                 "cpu_offload", "activation_offloading"):
        assert fields[flag]["tag"] == "select", flag
        assert fields[flag]["options"] == [str(defaults[flag]).lower(), str(not defaults[flag]).lower()], flag
    capacity = fields["moe_capacity_factor"]
    assert defaults["moe_capacity_factor"] is None
    assert (capacity["tag"], capacity["type"], capacity["min"], capacity["max"]) == ("input", "number", "1", "64")
    assert "value" not in capacity  # empty: dropless, left out of the request
    a2a = fields["cp_a2a_size"]  # hierarchical CP's all-to-all level: empty, left out
    assert defaults["cp_a2a_size"] is None and (a2a["tag"], a2a["type"], a2a["min"]) == ("input", "number", "2") and "value" not in a2a
    group = fields["microbatch_group_size_per_vp_stage"]  # Megatron-Core's interleaved group: empty, left out (0: the planner's choice)
    assert defaults["microbatch_group_size_per_vp_stage"] == 0
    assert (group["tag"], group["type"], group["min"]) == ("input", "number", "2") and "value" not in group
    schedules = fields["pipeline_schedules_per_step"]  # one pipeline schedule a step: empty, left out
    assert defaults["pipeline_schedules_per_step"] == 1
    assert (schedules["tag"], schedules["type"], schedules["min"]) == ("input", "number", "1") and "value" not in schedules
    from cost_model.frameworks import OFFLOAD_MODULES

    modules = fields["offload_modules"]
    assert modules["tag"] == "select" and tuple(modules["options"]) == OFFLOAD_MODULES and defaults["offload_modules"] == ()
    offload = fields["optimizer_offload_fraction"]
    assert defaults["optimizer_offload_fraction"] == 0.0
    assert (offload["tag"], offload["type"], offload["min"], offload["max"]) == ("input", "number", "0", "1") and "value" not in offload
    # LoRA: a rank (empty: full finetuning), the layers (none selected: all four), the dropout, the
    # base dtype (empty: the training dtype); the loss kernel, unfused first
    from cost_model.frameworks import LORA_BASE_DTYPES, LORA_MODULES, LOSS_KERNELS

    assert defaults["lora_rank"] == 0 and (fields["lora_rank"]["tag"], fields["lora_rank"]["type"]) == ("input", "number")
    assert tuple(fields["lora_target_modules"]["options"]) == LORA_MODULES and defaults["lora_target_modules"] == ()
    assert defaults["lora_dropout"] == 0.0 and (fields["lora_dropout"]["tag"], fields["lora_dropout"]["type"]) == ("input", "number")
    assert fields["lora_base_dtype"]["options"] == ["", *LORA_BASE_DTYPES] and defaults["lora_base_dtype"] is None
    assert tuple(fields["loss_kernel"]["options"]) == LOSS_KERNELS and defaults["loss_kernel"] == LOSS_KERNELS[0]
    # the script leaves a key out exactly when its control is at the contract's default
    choices = _training_choices()
    assert set(choices) == {"attention", "cp_comm_type", "grad_accum_dtype", "moe_token_dispatcher", "tp_comm_overlap", "grad_reduce_overlap",
                            "fused_kernels", "moe_comm_overlap", "precision_aware_optimizer", "master_weights", "cpu_offload",
                            "activation_offloading", "lora_base_dtype", "loss_kernel", "fp8_param_gather", "submodule_checkpointing",
                            "optimizer_in_backward", "reference_model", *OPTIMIZER_DTYPES}
    for key, (ident, default) in choices.items():
        assert fields[key]["id"] == ident, key
        assert default == fields[key]["options"][0], key
        assert default == ("" if defaults[key] is None else str(defaults[key]).lower() if isinstance(defaults[key], bool) else defaults[key]), key
    script = (WEB / "app.js").read_text()
    assert f'num("#{capacity["id"]}")' in script and f'num("#{a2a["id"]}")' in script and f'num("#{group["id"]}")' in script
    assert f'num("#{schedules["id"]}")' in script
    # the options sit in a collapsed block inside the Training fieldset
    page = (WEB / "index.html").read_text()
    training = re.search(r'<fieldset data-field="training">(.*?)</fieldset>', page, re.S).group(1)
    details = re.search(r'<details id="training-options"[^>]*>(.*?)</details>', training, re.S)
    assert details and "<summary>More training options</summary>" in details.group(1)
    assert " open" not in re.search(r'<details id="training-options"[^>]*>', training).group(0)
    for key in choices.keys() | {"moe_capacity_factor", "cp_a2a_size", "microbatch_group_size_per_vp_stage", "pipeline_schedules_per_step"}:
        assert f'data-field="training.{key}"' in details.group(1), key
