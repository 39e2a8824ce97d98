"""The web page in headless Chromium against a real uvicorn server: compose and submit a plan,
read the rendered plan, get launch files, list and page through stored plans, see 4xx errors
next to the field they name, run a job, replan after a node failure, choose the framework and
pin strategy knobs from the form.

Every wait is an explicit condition (WebDriverWait); nothing sleeps.  Skipped when Chromium,
chromedriver or selenium are missing (see conftest.py).
"""

from __future__ import annotations

import json
import re

import httpx
import pytest

pytest.importorskip("selenium", reason="browser tests need the selenium package (pip install -e '.[test]')")

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

SMALL_CLUSTER = {"name": "one-node", "node_groups": [{"name": "g0", "count": 1, "gpus_per_node": 8, "device": "A100-SXM4-80GB"}]}
SMALL_REQUEST = {"model": {"preset": "gpt3-125m"}, "training": {"global_batch_size": 64, "sequence_length": 2048}, "cluster": SMALL_CLUSTER}


def wait(driver, timeout_s: float = 15):
    return WebDriverWait(driver, timeout_s, poll_frequency=0.05)


def css(root, selector):
    return root.find_element(By.CSS_SELECTOR, selector)


def all_css(root, selector):
    return root.find_elements(By.CSS_SELECTOR, selector)


def present(selector):
    """Condition: the element matching ``selector`` (or False)."""

    def check(driver):
        found = all_css(driver, selector)
        return found[0] if found else False

    return check


def fill(element, value) -> None:
    element.clear()
    element.send_keys(str(value))


def open_page(driver, base: str, hash_: str = "#/new") -> None:
    """A fresh load of the page (a URL that differs only in its hash would not reload it)."""
    driver.get("about:blank")
    driver.get(f"{base}/{hash_}")
    wait(driver).until(present("body[data-ready]"))


def rendered_plan_id(driver, previous: str | None = None) -> str:
    """Wait until a plan (other than ``previous``) is rendered; its id."""

    def check(d):
        els = all_css(d, "#plan-body[data-plan-id]")
        if not els:
            return False
        pid = els[0].get_attribute("data-plan-id")
        return pid if pid != previous else False

    return wait(driver).until(check)


def text_of(element) -> str:
    return element.get_attribute("textContent")


def submit_and_expect_error_at(driver, control, message_start: str, note_contains: str) -> None:
    """Submit the form and check the 422 is shown at ``control``: marked invalid, the form's error
    box starting with ``message_start``, the control's note (aria-describedby) showing
    ``note_contains``, and focus moved to it."""
    css(driver, "#submit-plan").click()
    wait(driver).until(lambda _: control.get_attribute("aria-invalid") == "true")
    assert css(driver, "#form-error").text.startswith(message_start)
    note = css(driver, "#" + control.get_attribute("aria-describedby"))
    assert note_contains in note.text and note.is_displayed()
    assert driver.switch_to.active_element == control


def pairs(driver, selector: str, key: str, value: str) -> dict[str, str]:
    """{text of ``key`` → text of ``value``} inside each element matching ``selector`` (one
    round trip to the browser)."""
    return driver.execute_script(
        "return Object.fromEntries(Array.from(document.querySelectorAll(arguments[0]))"
        ".map(e => [e.querySelector(arguments[1]).textContent, e.querySelector(arguments[2]).textContent]))",
        selector,
        key,
        value,
    )


def cell_texts(driver, selector: str) -> list[list[str]]:
    """The cells' texts of each table row matching ``selector``."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0])).map(tr => Array.from(tr.cells).map(td => td.textContent))",
        selector,
    )


@pytest.fixture(autouse=True)
def no_script_errors(browser):
    """Fail a test whose page logged an error (an exception, a CSP violation); a 4xx answer
    that the page shows on purpose is fine."""
    browser.get_log("browser")  # drop what earlier tests left
    yield
    errors = [
        e["message"]
        for e in browser.get_log("browser")
        if e["level"] == "SEVERE" and "the server responded with a status of 4" not in e["message"]
    ]
    assert not errors, errors


def api(live_server, method: str, path: str, body=None) -> httpx.Response:
    return httpx.request(method, live_server.base + path, json=body, timeout=30)


def test_submit_a_plan_see_it_find_it_in_the_list_and_get_launch_files(browser, live_server, screenshot):
    d = browser
    open_page(d, live_server.base)
    Select(css(d, "#preset")).select_by_value("gpt3-125m")
    assert "12 layers" in css(d, "#preset-info").text
    fill(css(d, "#global-batch"), 64)
    fill(css(d, "#seq-len"), 2048)
    Select(css(d, "#dtype")).select_by_value("bf16")
    fill(css(d, "#cluster-name"), "web-one-node")
    group = css(d, "#groups tr")
    Select(css(group, '[data-key="device"]')).select_by_value("A100-SXM4-80GB")
    fill(css(group, '[data-key="count"]'), 1)
    fill(css(group, '[data-key="gpus_per_node"]'), 8)
    css(d, "#submit-plan").click()

    plan_id = rendered_plan_id(d)
    assert d.current_url.endswith(f"#/plans/{plan_id}")
    plan = api(live_server, "GET", f"/v1/plans/{plan_id}").json()
    assert plan["model"]["name"] == "gpt3-125m" and plan["cluster"]["name"] == "web-one-node"
    assert plan["training"]["global_batch_size"] == 64 and plan["training"]["sequence_length"] == 2048
    assert css(d, "#flash").text == "Planned."
    constraints = d.execute_script(
        "return Array.from(document.querySelectorAll('[data-section=\"overview\"] dt'))"
        ".find(dt => dt.textContent === 'Constraints').nextElementSibling.textContent"
    )
    assert constraints == "none: the search chose every knob"

    # Strategy knobs: exactly the stored plan's.
    knobs = pairs(d, "#strategy > div", "dt", "dd")
    strategy = plan["best"]["strategy"]
    for key, label in (("dp", "data parallel (dp)"), ("tp", "tensor parallel (tp)"), ("pp", "pipeline parallel (pp)"), ("micro_batch_size", "micro-batch size"), ("zero_stage", "ZeRO stage")):
        assert knobs[label] == str(strategy[key]), label
    depth = strategy.get("recompute_num_layers")
    assert knobs["recompute"] == (f"{strategy['recompute']}, first {depth} layers of each chunk (block)" if depth else strategy["recompute"])

    # Prediction cards and the stages table.
    cards = pairs(d, ".card", ".card-label", ".card-value")
    assert cards["Tokens/s"] == f"{round(plan['best']['prediction']['tokens_per_s']):,}"
    assert cards["MFU"] == f"{plan['best']['prediction']['mfu'] * 100:.1f}%"
    # The step time carries its p10–p90 interval, as the memory card does.
    assert re.fullmatch(r"\S+ \S+ \(p10–p90 \S+ \S+–\S+ \S+\)", cards["Step time"]), cards["Step time"]
    # The memory interval says when no peak was measured under the plan's framework.
    bounded = plan["best"]["prediction"]["memory_interval_basis"] == "fragmentation-bounds"
    assert ("no measured peaks for this framework" in cards["Peak memory (max stage)"]) == bounded
    rows = cell_texts(d, "#stages-table tbody tr")
    assert len(rows) == len(plan["best"]["stages"]) == 1
    cells = rows[0]
    stage = plan["best"]["stages"][0]
    assert cells[1].startswith(f"{stage['first_layer']}–{stage['last_layer']} ({stage['num_layers']})")
    assert cells[2] == "A100-SXM4-80GB" and cells[4] == ", ".join(stage["hosts"]) and cells[5] == "8"

    # The breakdown bar: one segment per non-zero term, widths adding up to the whole bar.
    breakdown = plan["best"]["prediction"]["breakdown_s"]
    segments = all_css(d, '[data-section="breakdown"] .bar .seg')
    assert len(segments) == sum(1 for v in breakdown.values() if v > 0)
    widths = d.execute_script("return Array.from(document.querySelectorAll('.bar .seg')).map(s => parseFloat(s.style.width))")
    assert abs(sum(widths) - 100.0) < 0.01
    alt_rows = all_css(d, "#alternatives-table tbody tr")
    assert len(alt_rows) == len(plan["alternatives"])
    assert text_of(css(d, "#explanation-summary")) == plan["explanation"]["summary"]
    assert not re.search(r"\b(null|undefined|NaN)\b|\[object ", text_of(css(d, "#plan-body")))
    shot = screenshot(d, "plan")
    assert shot.stat().st_size > 10_000

    # Launch files: the page shows what the API renders, and the download link serves it.
    Select(css(d, "#launch-target")).select_by_value("slurm")
    css(d, "#launch-submit").click()
    sbatch = wait(d).until(present('.launch-file[data-name="job.sbatch"]'))
    expected = api(live_server, "GET", f"/v1/plans/{plan_id}/launch?target=slurm").json()["files"]
    assert sorted(el.get_attribute("data-name") for el in all_css(d, ".launch-file")) == sorted(expected)
    assert text_of(css(sbatch, "pre")) == expected["job.sbatch"]
    assert "#SBATCH" in expected["job.sbatch"]
    href = css(sbatch, "a[download]").get_attribute("href")
    assert httpx.get(href, timeout=10).text == expected["job.sbatch"]

    # The plans list has it; filters narrow the list; a click opens it again.
    css(d, "#nav-plans").click()
    wait(d).until(present(f'#plans-body[data-query] tr[data-plan-id="{plan_id}"]'))
    fill(css(d, "#f-model"), "gpt3-125m")
    Select(css(d, "#f-device")).select_by_value("A100-SXM4-80GB")
    css(d, '#filter-form button[type="submit"]').click()
    wait(d).until(present('#plans-body[data-query*="device=A100-SXM4-80GB"]'))
    assert all_css(d, f'#plans-body tr[data-plan-id="{plan_id}"]')
    assert "model=gpt3-125m" in d.current_url
    fill(css(d, "#f-min-tps"), 10**12)
    css(d, '#filter-form button[type="submit"]').click()
    wait(d).until(present('#plans-body[data-query*="min_tokens_per_s"]'))
    assert css(d, "#plans-empty").is_displayed() and not all_css(d, "#plans-body tr")
    d.back()
    row = wait(d).until(present(f'#plans-body[data-query] tr[data-plan-id="{plan_id}"]'))
    css(row, "td:nth-child(3)").click()
    assert rendered_plan_id(d) == plan_id


def test_api_errors_are_shown_next_to_the_field_they_name(browser, live_server):
    d = browser
    open_page(d, live_server.base)
    count = css(d, '#groups [data-key="count"]')
    fill(count, 0)
    css(d, "#submit-plan").click()
    wait(d).until(present('#groups [data-key="count"][aria-invalid="true"]'))
    assert count.get_attribute("data-field") == "cluster.node_groups[0].count"
    note = css(d, "#" + count.get_attribute("aria-describedby"))
    assert "positive integer" in note.text
    assert css(d, "#form-error").text.startswith("cluster.node_groups[0].count:")
    assert d.switch_to.active_element == count
    fill(count, 1)

    # A config.json without hidden_size: the server names model.transformer.hidden_size; the
    # page marks the config text area.
    css(d, 'input[name="model-kind"][value="transformer"]').click()
    config = css(d, "#hf-config")
    fill(config, json.dumps({"num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 1000}))
    css(d, "#submit-plan").click()
    wait(d).until(present('#hf-config[aria-invalid="true"]'))
    assert css(d, "#form-error").text.startswith("model.transformer.hidden_size:")
    assert "model.transformer.hidden_size" in css(d, "#" + config.get_attribute("aria-describedby")).text
    # Not JSON at all: caught before sending.
    fill(config, "{not json")
    css(d, "#submit-plan").click()
    wait(d).until(present("#form-error:not([hidden])"))
    assert "model.transformer: is not valid JSON" in css(d, "#form-error").text

    # An infeasible request: the message says what is short.
    css(d, 'input[name="model-kind"][value="preset"]').click()
    Select(css(d, "#preset")).select_by_value("llama3-70b")
    Select(css(d, '#groups [data-key="device"]')).select_by_value("A10-24GB")
    css(d, "#submit-plan").click()
    wait(d).until(lambda d: "no strategy fits" in css(d, "#form-error").text)
    assert css(d, "#form-error").text.startswith("cluster:")


def test_request_json_mode_and_an_async_job(browser, live_server):
    d = browser
    open_page(d, live_server.base)
    Select(css(d, "#preset")).select_by_value("gpt3-125m")
    css(d, 'input[name="mode"][value="json"]').click()
    area = css(d, "#request-json")
    assert area.is_displayed() and not css(d, "#preset").is_displayed()
    body = json.loads(area.get_attribute("value"))
    assert body["model"] == {"preset": "gpt3-125m"}
    assert body["cluster"]["node_groups"][0]["device"] == "A100-SXM4-80GB"
    body.update({"async": True, "force": True, "top_k": 2})
    d.execute_script("arguments[0].value = arguments[1]", area, json.dumps(body))
    css(d, "#submit-plan").click()
    plan_id = rendered_plan_id(d)
    assert css(d, "#flash").text.startswith("Planned by job ")
    plan = api(live_server, "GET", f"/v1/plans/{plan_id}").json()
    assert plan["top_k"] == 2 and len(all_css(d, "#alternatives-table tbody tr")) == len(plan["alternatives"]) <= 2

    # Malformed JSON in the text area is reported without a request.
    css(d, "#nav-new").click()
    wait(d).until(lambda d: css(d, "#request-json").is_displayed())
    d.execute_script("arguments[0].value = '[1, 2'", css(d, "#request-json"))
    css(d, "#submit-plan").click()
    wait(d).until(present("#form-error:not([hidden])"))
    assert css(d, "#form-error").text.startswith("body: is not valid JSON")


def test_saved_cluster_and_constraints(browser, live_server):
    d = browser
    saved = {"name": "web-saved", "node_groups": [{"name": "a100", "count": 1, "gpus_per_node": 8, "device": "A100-SXM4-80GB"}]}
    assert api(live_server, "PUT", "/v1/clusters/web-saved", saved).status_code == 200
    open_page(d, live_server.base)
    css(d, 'input[name="cluster-kind"][value="saved"]').click()
    Select(css(d, "#saved-cluster")).select_by_value("web-saved")
    assert css(d, "#saved-info").text == "1 × 8 A100-SXM4-80GB"
    css(d, "#more-options summary").click()
    fill(css(d, "#c-tp"), 2)
    fill(css(d, "#c-headroom"), 0.2)
    Select(css(d, "#objective")).select_by_value("throughput")
    css(d, "#submit-plan").click()
    plan_id = rendered_plan_id(d)
    plan = api(live_server, "GET", f"/v1/plans/{plan_id}").json()
    assert plan["cluster"]["name"] == "web-saved"
    assert plan["constraints"]["tp"] == 2 and plan["constraints"]["memory_headroom_fraction"] == 0.2
    assert plan["best"]["strategy"]["tp"] == 2
    assert pairs(d, "#strategy > div", "dt", "dd")["tensor parallel (tp)"] == "2"


def test_allowed_device_types_plan_on_the_selected_devices_only(browser, live_server, view_screenshot):
    d = browser
    small_one_node_form(d, live_server)
    css(d, "#add-group").click()
    second = all_css(d, "#groups tr")[1]
    Select(css(second, '[data-key="device"]')).select_by_value("H100-SXM5-80GB")
    fill(css(second, '[data-key="count"]'), 1)
    fill(css(second, '[data-key="gpus_per_node"]'), 8)
    devices = Select(css(d, "#c-devices"))
    assert "H100-SXM5-80GB" in [o.get_attribute("value") for o in devices.options]
    assert "constraints" not in form_body(d)  # none selected: the key is left out
    devices.select_by_value("A100-SXM4-80GB")
    assert view_screenshot(css(d, "#c-devices").find_element(By.XPATH, "./ancestor::fieldset[1]"), "form-allowed-devices").stat().st_size > 5_000
    assert form_body(d)["constraints"] == {"allowed_device_types": ["A100-SXM4-80GB"]}
    css(d, "#force").click()
    css(d, "#submit-plan").click()

    plan = api(live_server, "GET", f"/v1/plans/{rendered_plan_id(d)}").json()
    assert plan["constraints"]["allowed_device_types"] == ["A100-SXM4-80GB"]
    assert plan["summary"]["device_types"] == ["A100-SXM4-80GB"]  # the faster H100 node is left out
    assert {s["device"] for s in plan["best"]["prediction"]["stages"]} == {"A100-SXM4-80GB"}
    constraints = d.execute_script(
        "return Array.from(document.querySelectorAll('[data-section=\"overview\"] dt'))"
        ".find(dt => dt.textContent === 'Constraints').nextElementSibling.textContent"
    )
    assert constraints == "allowed_device_types A100-SXM4-80GB"


def test_deep_link_replan_with_a_node_down_shows_the_diff(browser, live_server):
    d = browser
    open_page(d, live_server.base, "#/plans/no-such-plan")
    box = wait(d).until(present("#plan-error:not([hidden])"))
    assert box.text == "id: plan 'no-such-plan' does not exist"
    request = {
        **SMALL_REQUEST,
        "cluster": {"name": "web-two-node", "node_groups": [{"name": "g0", "count": 2, "gpus_per_node": 8, "device": "A100-SXM4-80GB", "hostnames": ["web-n0", "web-n1"]}]},
    }
    created = api(live_server, "POST", "/v1/plans", request)
    assert created.status_code in (200, 201), created.text
    parent_id = created.json()["id"]
    open_page(d, live_server.base, f"#/plans/{parent_id}")
    assert rendered_plan_id(d) == parent_id
    boxes = {el.get_attribute("value"): el for el in all_css(d, '#replan-form input[type="checkbox"]')}
    assert set(boxes) == {"web-n0", "web-n1"}
    boxes["web-n1"].click()
    css(d, "#replan-submit").click()
    child_id = rendered_plan_id(d, previous=parent_id)
    child = api(live_server, "GET", f"/v1/plans/{child_id}").json()
    assert child["parent_id"] == parent_id
    diff = child["diff"]
    section = css(d, '[data-section="diff"]')
    assert f"{diff['ranks_moved']} (ranks {diff['ranks_before']} → {diff['ranks_after']})" in section.text
    changes = {row[0]: row[1:] for row in cell_texts(d, "#diff-table tbody tr")}
    assert changes == {k: [json.dumps(v["from"]), json.dumps(v["to"])] for k, v in diff["strategy_changes"].items()}
    # The node that is down now shows as such; replanning with every node down is a 422 shown inline.
    boxes = {el.get_attribute("value"): el for el in all_css(d, '#replan-form input[type="checkbox"]')}
    assert boxes["web-n1"].get_attribute("disabled") is not None and boxes["web-n1"].is_selected()
    boxes["web-n0"].click()
    css(d, "#replan-submit").click()
    box = wait(d).until(present("#replan-form .error-box:not([hidden])"))
    assert "no devices left" in box.text


def test_plans_list_pages_with_the_more_button(browser, live_server):
    d = browser
    for batch in (32, 128, 256):
        r = api(live_server, "POST", "/v1/plans", {**SMALL_REQUEST, "training": {"global_batch_size": batch, "sequence_length": 1024}})
        assert r.status_code in (200, 201), r.text
    expected = [p["id"] for p in api(live_server, "GET", "/v1/plans?limit=200").json()["items"]]
    assert len(expected) >= 4
    open_page(d, live_server.base, "#/plans?limit=2")
    wait(d).until(present("#plans-body[data-query]"))
    assert len(all_css(d, "#plans-body tr")) == 2
    more = css(d, "#plans-more")
    while more.is_displayed():
        before = len(all_css(d, "#plans-body tr"))
        more.click()
        wait(d).until(lambda d, before=before: len(all_css(d, "#plans-body tr")) > before or not more.is_displayed())
    shown = [tr.get_attribute("data-plan-id") for tr in all_css(d, "#plans-body tr")]
    assert shown == expected


def form_body(driver) -> dict:
    """The request body the form describes, as the "Request JSON" mode shows it (then back to
    the form)."""
    area = css(driver, "#request-json")
    driver.execute_script("arguments[0].value = ''", area)  # the JSON mode fills an empty text area from the form
    css(driver, 'input[name="mode"][value="json"]').click()
    body = json.loads(area.get_attribute("value"))
    css(driver, 'input[name="mode"][value="form"]').click()
    driver.execute_script("arguments[0].value = ''", area)
    return body


def small_one_node_form(driver, live_server, framework: str | None = None) -> None:
    """A fresh page with gpt3-125m on one node of 8 A100s, the constraints opened."""
    open_page(driver, live_server.base)
    Select(css(driver, "#preset")).select_by_value("gpt3-125m")
    fill(css(driver, "#global-batch"), 64)
    fill(css(driver, "#seq-len"), 2048)
    if framework is not None:
        Select(css(driver, "#framework")).select_by_value(framework)
    css(driver, "#more-options summary").click()


def test_default_form_leaves_framework_and_constraints_out_of_the_request(browser, live_server):
    d = browser
    open_page(d, live_server.base)
    assert Select(css(d, "#framework")).first_selected_option.get_attribute("value") == "megatron-core"
    assert "Megatron-Core with Transformer Engine" in css(d, "#framework-info").get_attribute("textContent")
    body = form_body(d)
    assert "framework" not in body["training"] and "constraints" not in body
    # a framework's hint says what it can run, and changes with the choice
    Select(css(d, "#framework")).select_by_value("fsdp")
    assert "HSDP" in css(d, "#framework-info").get_attribute("textContent")
    assert css(d, "#framework").get_attribute("aria-describedby") == "framework-info"

    # every other pin reaches the body under its contract name, with its JSON type
    css(d, "#more-options summary").click()
    for sel, value in (("#c-dp", 4), ("#c-tp", 2), ("#c-pp", 1), ("#c-cp", 1), ("#c-ep", 1), ("#c-vpp", 1), ("#c-recompute-layers", 0), ("#c-dp-shard", 2), ("#c-max-devices", 8), ("#c-layers", "6, 6")):
        fill(css(d, sel), value)
    for sel, value in (("#c-sp", "true"), ("#c-split-emb", "false"), ("#c-split-loss", "true"), ("#c-recompute", "full"), ("#c-zero", "0")):
        Select(css(d, sel)).select_by_value(value)
    modules = Select(css(d, "#c-recompute-modules"))
    for value in ("moe_act", "layernorm"):
        modules.select_by_value(value)
    assert form_body(d)["constraints"] == {
        "dp": 4, "tp": 2, "pp": 1, "cp": 1, "ep": 1, "vpp": 1, "recompute_num_layers": 0, "dp_shard": 2, "max_devices": 8,
        "layers_per_stage": [6, 6], "sequence_parallel": True, "account_for_embedding_in_pipeline_split": False,
        "account_for_loss_in_pipeline_split": True, "recompute": "full", "zero_stage": 0, "recompute_modules": ["moe_act", "layernorm"],
    }


def test_framework_and_pins_from_the_form_are_planned_and_shown(browser, live_server, view_screenshot):
    d = browser
    small_one_node_form(d, live_server, "deepspeed")
    Select(css(d, "#c-zero")).select_by_value("3")
    fill(css(d, "#c-mbs"), 2)
    Select(css(d, "#c-sp")).select_by_value("false")
    Select(css(d, "#c-recompute")).select_by_value("none")
    Select(css(d, "#c-tight")).select_by_value("reject")
    shot = view_screenshot(css(d, "#plan-form"), "form-framework-and-pins")
    assert shot.stat().st_size > 10_000
    body = form_body(d)
    assert body["training"]["framework"] == "deepspeed"
    assert body["constraints"] == {"zero_stage": 3, "micro_batch_size": 2, "sequence_parallel": False, "recompute": "none", "tight_memory": "reject"}
    css(d, "#force").click()
    css(d, "#submit-plan").click()

    plan_id = rendered_plan_id(d)
    plan = api(live_server, "GET", f"/v1/plans/{plan_id}").json()
    assert plan["training"]["framework"] == "deepspeed"
    assert {k: plan["constraints"][k] for k in body["constraints"]} == body["constraints"]
    strategy = plan["best"]["strategy"]
    assert (strategy["zero_stage"], strategy["micro_batch_size"], strategy["sequence_parallel"], strategy["recompute"]) == (3, 2, False, "none")
    assert strategy["tp"] == 1 and strategy["pp"] == 1  # deepspeed: no tp; ZeRO-3 not with a pipeline
    knobs = pairs(d, "#strategy > div", "dt", "dd")
    assert knobs["ZeRO stage"] == "3" and knobs["micro-batch size"] == "2"
    assert knobs["sequence parallel"] == "no" and knobs["recompute"] == "none"
    def overview(name: str) -> str:
        return d.execute_script(
            "return Array.from(document.querySelectorAll('[data-section=\"overview\"] dt'))"
            ".find(dt => dt.textContent === arguments[0]).nextElementSibling.textContent", name
        )

    assert overview("Training") == "batch 64 × 2048 tokens, bf16, adam, deepspeed"
    # the request's pins are shown with the plan, the unset limits left out
    assert set(overview("Constraints").split(", ")) == {
        "micro_batch_size 2", "recompute none", "sequence_parallel false", "zero_stage 3", "tight_memory reject"}
    for a in plan["alternatives"]:  # the pins hold for every alternative too
        assert (a["strategy"]["zero_stage"], a["strategy"]["micro_batch_size"]) == (3, 2)


def test_a_pin_the_framework_cannot_run_is_shown_next_to_that_pin(browser, live_server, view_screenshot):
    d = browser
    small_one_node_form(d, live_server, "deepspeed")
    shard = css(d, "#c-dp-shard")
    fill(shard, 2)
    submit_and_expect_error_at(d, shard, "constraints.dp_shard: deepspeed: no partial sharding", "no partial sharding")
    view_screenshot(css(d, '#more-options fieldset[data-field="constraints"]'), "form-pin-error")

    # FSDP has no ZeRO-1: the 422 names the zero_stage select, and the old note is gone.
    fill(shard, "")
    Select(css(d, "#framework")).select_by_value("fsdp")
    zero = css(d, "#c-zero")
    Select(zero).select_by_value("1")
    css(d, "#submit-plan").click()
    wait(d).until(present('#c-zero[aria-invalid="true"]'))
    assert css(d, "#form-error").text.startswith("constraints.zero_stage: fsdp: no zero_stage 1")
    assert "SHARD_GRAD_OP" in css(d, "#" + zero.get_attribute("aria-describedby")).text
    assert shard.get_attribute("aria-invalid") is None
    assert d.switch_to.active_element == zero

    # A layers-per-stage list that is not numbers is caught before sending.
    Select(zero).select_by_value("")
    fill(css(d, "#c-layers"), "6, six")
    css(d, "#submit-plan").click()
    wait(d).until(present('#c-layers[aria-invalid="true"]'))
    assert css(d, "#form-error").text.startswith("constraints.layers_per_stage: must be whole numbers")


TRAINING_OPTION_KEYS = {"attention", "fused_kernels", "tp_comm_overlap", "grad_reduce_overlap", "cp_comm_type", "grad_accum_dtype", "moe_token_dispatcher",
                        "moe_comm_overlap", "moe_capacity_factor", "precision_aware_optimizer", "main_grads_dtype", "main_params_dtype",
                        "exp_avg_dtype", "exp_avg_sq_dtype", "master_weights", "optimizer_offload_fraction", "cpu_offload",
                        "activation_offloading", "offload_modules", "cp_a2a_size", "microbatch_group_size_per_vp_stage",
                        "pipeline_schedules_per_step", "submodule_checkpointing"}


def test_more_training_options_are_left_out_at_their_defaults_and_sent_when_changed(browser, live_server, view_screenshot):
    d = browser
    open_page(d, live_server.base)
    details = css(d, "#training-options")
    assert details.get_attribute("open") is None and not css(d, "#t-attention").is_displayed()
    body = form_body(d)
    assert not TRAINING_OPTION_KEYS & set(body["training"]), body["training"]
    # the contract's defaults are what the controls show
    shown = {sel: Select(css(d, sel)).first_selected_option.get_attribute("value")
             for sel in ("#t-attention", "#t-fused-kernels", "#t-tp-overlap", "#t-grad-overlap", "#t-cp-comm", "#t-grad-accum", "#t-moe-dispatcher", "#t-moe-overlap",
                         "#t-precision-aware", "#t-main-grads", "#t-main-params", "#t-exp-avg", "#t-exp-avg-sq", "#t-master-weights", "#t-cpu-offload",
                         "#t-act-offload")}
    assert shown == {"#t-attention": "flash", "#t-fused-kernels": "true", "#t-tp-overlap": "false", "#t-grad-overlap": "true", "#t-cp-comm": "",
                     "#t-grad-accum": "", "#t-moe-dispatcher": "alltoall", "#t-moe-overlap": "false", "#t-precision-aware": "false",
                     "#t-main-grads": "fp32", "#t-main-params": "fp32", "#t-exp-avg": "fp32", "#t-exp-avg-sq": "fp32",
                     "#t-master-weights": "true", "#t-cpu-offload": "false", "#t-act-offload": "false"}
    assert css(d, "#t-moe-capacity").get_attribute("value") == "" and css(d, "#t-offload").get_attribute("value") == ""

    # each changed control reaches the body under its contract name, with its JSON type
    css(d, "#training-options summary").click()
    assert css(d, "#t-attention").is_displayed()
    view_screenshot(css(d, 'fieldset[data-field="training"]'), "form-training-options")
    for sel, value in (("#t-tp-overlap", "true"), ("#t-grad-overlap", "false"), ("#t-moe-dispatcher", "deepep"), ("#t-moe-overlap", "true"), ("#t-cp-comm", "a2a+p2p")):
        Select(css(d, sel)).select_by_value(value)
    fill(css(d, "#t-moe-capacity"), 1.25)
    fill(css(d, "#t-cp-a2a"), 4)
    fill(css(d, "#t-mb-group"), 6)
    fill(css(d, "#t-pp-schedules"), 2)
    Select(css(d, "#t-submodule-ckpt")).select_by_value("true")
    training = form_body(d)["training"]
    assert {k: training[k] for k in TRAINING_OPTION_KEYS & set(training)} == {
        "tp_comm_overlap": True, "grad_reduce_overlap": False, "moe_token_dispatcher": "deepep", "moe_comm_overlap": True,
        "cp_comm_type": "a2a+p2p", "cp_a2a_size": 4, "moe_capacity_factor": 1.25, "microbatch_group_size_per_vp_stage": 6,
        "pipeline_schedules_per_step": 2, "submodule_checkpointing": True}
    # back at the defaults, the keys are gone again
    for sel, value in (("#t-tp-overlap", "false"), ("#t-grad-overlap", "true"), ("#t-moe-dispatcher", "alltoall"), ("#t-moe-overlap", "false"), ("#t-cp-comm", "")):
        Select(css(d, sel)).select_by_value(value)
    fill(css(d, "#t-moe-capacity"), "")
    fill(css(d, "#t-cp-a2a"), "")
    fill(css(d, "#t-mb-group"), "")
    fill(css(d, "#t-pp-schedules"), "")
    Select(css(d, "#t-submodule-ckpt")).select_by_value("false")
    assert not TRAINING_OPTION_KEYS & set(form_body(d)["training"])


def test_a_training_option_the_framework_lacks_is_shown_next_to_it_then_planned(browser, live_server, view_screenshot):
    d = browser
    small_one_node_form(d, live_server, "deepspeed")
    css(d, "#training-options summary").click()
    Select(css(d, "#t-attention")).select_by_value("unfused")
    Select(css(d, "#t-fused-kernels")).select_by_value("false")
    cp = css(d, "#t-cp-comm")
    Select(cp).select_by_value("a2a+p2p")  # DeepSpeed's context parallelism: Ulysses' all-to-all or ring-flash-attn's, not hierarchical
    assert {k: form_body(d)["training"].get(k) for k in ("attention", "fused_kernels", "cp_comm_type")} == {
        "attention": "unfused", "fused_kernels": False, "cp_comm_type": "a2a+p2p"}
    submit_and_expect_error_at(d, cp, "training.cp_comm_type: deepspeed: no 'a2a+p2p' context-parallel exchange", "a2a")
    view_screenshot(css(d, 'fieldset[data-field="training"]'), "form-training-option-error")

    # a capacity factor out of range, the options collapsed: the 422 opens them at that input
    Select(cp).select_by_value("a2a")
    capacity = css(d, "#t-moe-capacity")
    fill(capacity, 0.5)
    css(d, "#training-options summary").click()
    assert not capacity.is_displayed()
    css(d, "#submit-plan").click()
    wait(d).until(present('#t-moe-capacity[aria-invalid="true"]'))
    assert css(d, "#form-error").text.startswith("training.moe_capacity_factor: must be a number from 1 to 64")
    assert capacity.is_displayed() and cp.get_attribute("aria-invalid") is None

    # a combination DeepSpeed has: planned, and stored with the request's options
    fill(capacity, "")
    Select(css(d, "#t-grad-accum")).select_by_value("fp32")  # DeepSpeed's data_types.grad_accum_dtype
    css(d, "#submit-plan").click()
    plan_id = rendered_plan_id(d)
    training = api(live_server, "GET", f"/v1/plans/{plan_id}").json()["training"]
    assert training["framework"] == "deepspeed" and training["attention"] == "unfused"
    assert training["fused_kernels"] is False and training["cp_comm_type"] == "a2a" and training["grad_accum_dtype"] == "fp32"

    # Megatron-Core has no such setting: the 422 is shown next to that control
    small_one_node_form(d, live_server, "megatron-core")
    css(d, "#training-options summary").click()
    accum = css(d, "#t-grad-accum")
    Select(accum).select_by_value("fp32")
    submit_and_expect_error_at(d, accum, "training.grad_accum_dtype: megatron-core: no grad_accum_dtype setting", "DeepSpeed")
    assert "moe_capacity_factor" not in training


def test_megatron_cores_optimizer_precision_is_planned_from_the_page(browser, live_server):
    """The precision-aware optimizer with bf16 moments and gradient buffer, chosen on the page:
    the body carries them under their contract names, the stored plan keeps them (at the
    distributed optimizer), and a moment dtype without the optimizer is refused next to it."""
    d = browser
    small_one_node_form(d, live_server, "megatron-core")
    css(d, "#training-options summary").click()
    exp_avg = css(d, "#t-exp-avg")
    Select(exp_avg).select_by_value("bf16")
    submit_and_expect_error_at(d, exp_avg, "training.exp_avg_dtype: exp_avg_dtype bf16 needs precision_aware_optimizer", "true")
    for sel, value in (("#t-precision-aware", "true"), ("#t-exp-avg-sq", "bf16"), ("#t-main-grads", "bf16")):
        Select(css(d, sel)).select_by_value(value)
    chosen = {"precision_aware_optimizer": True, "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16", "main_grads_dtype": "bf16"}
    assert {k: form_body(d)["training"].get(k) for k in chosen} == chosen
    css(d, "#submit-plan").click()
    plan = api(live_server, "GET", f"/v1/plans/{rendered_plan_id(d)}").json()
    assert {k: plan["training"][k] for k in chosen} == chosen and plan["best"]["strategy"]["zero_stage"] == 1


def refused_then_planned(d, live_server, select_id: str, value: str, refused_in: str, error_start: str, note: str,
                         planned_in: str) -> dict:
    """Choose ``value`` in the training option ``select_id``: under ``refused_in`` the 422 lands
    next to the control (``error_start``, its note holding ``note``); under ``planned_in`` the
    plan comes back — returned as stored."""
    for framework in (refused_in, planned_in):
        small_one_node_form(d, live_server, framework)
        css(d, "#training-options summary").click()
        control = css(d, select_id)
        Select(control).select_by_value(value)
        if framework == refused_in:
            submit_and_expect_error_at(d, control, error_start, note)
    css(d, "#submit-plan").click()
    return api(live_server, "GET", f"/v1/plans/{rendered_plan_id(d)}").json()


def test_pure_bf16_training_is_planned_from_the_page(browser, live_server):
    """FSDP without fp32 master weights (torchtitan's training.dtype bfloat16), chosen on the
    page: the body carries master_weights false, the stored plan keeps it with 2 + 2 + 4 bytes of
    state a parameter, and under Megatron-Core it is refused next to the control."""
    small_one_node_form(browser, live_server, "fsdp")
    css(browser, "#training-options summary").click()
    Select(css(browser, "#t-master-weights")).select_by_value("false")
    assert form_body(browser)["training"]["master_weights"] is False
    plan = refused_then_planned(browser, live_server, "#t-master-weights", "false", "megatron-core",
                                "training.master_weights: megatron-core: keeps fp32 master weights", "torchtitan", "fsdp")
    assert plan["training"]["master_weights"] is False


def test_optimizer_offload_is_planned_from_the_page(browser, live_server):
    """DeepSpeed's ZeRO-Offload chosen on the page: the body carries the fraction, the stored plan
    keeps it and says what the host holds; under FSDP (whose offload is cpu_offload, the whole
    sharded state) the 422 lands next to the control."""
    d = browser
    small_one_node_form(d, live_server, "fsdp")
    css(d, "#training-options summary").click()
    control = css(d, "#t-offload")
    fill(control, 1)
    assert form_body(d)["training"]["optimizer_offload_fraction"] == 1
    submit_and_expect_error_at(d, control, "training.optimizer_offload_fraction: fsdp: FSDP's CPU offload", "CPUOffloadPolicy")
    small_one_node_form(d, live_server, "deepspeed")
    css(d, "#training-options summary").click()
    fill(css(d, "#t-offload"), 0)  # nothing offloaded: the contract's default, left out
    assert "optimizer_offload_fraction" not in form_body(d)["training"]
    fill(css(d, "#t-offload"), 1)
    css(d, "#submit-plan").click()
    plan = api(live_server, "GET", f"/v1/plans/{rendered_plan_id(d)}").json()
    assert plan["training"]["optimizer_offload_fraction"] == 1.0 and plan["best"]["strategy"]["zero_stage"] >= 1
    assert any(w.startswith("optimizer offload (all of the state)") for w in plan["best"]["prediction"]["warnings"])


def test_fsdp_cpu_offload_is_planned_from_the_page(browser, live_server):
    """FSDP's CPU offload chosen on the page: a torchtitan plan with full sharding and the host's
    share in its warnings; under Megatron-Core it is refused next to the control."""
    plan = refused_then_planned(browser, live_server, "#t-cpu-offload", "true", "megatron-core",
                                "training.cpu_offload: megatron-core: no CPU offload of the parameters", "optimizer_offload_fraction", "fsdp")
    assert plan["training"]["cpu_offload"] is True and plan["best"]["strategy"]["zero_stage"] == 3
    assert any(w.startswith("CPU offload of the sharded") for w in plan["best"]["prediction"]["warnings"])


def test_activation_offloading_is_planned_from_the_page(browser, live_server):
    """Activation offloading chosen on the page: an FSDP plan without a pipeline whose warnings
    give the host memory its activations take; under Megatron-DeepSpeed (which has none priced) it
    is refused next to the control."""
    plan = refused_then_planned(browser, live_server, "#t-act-offload", "true", "megatron-deepspeed",
                                "training.activation_offloading: megatron-deepspeed: no activation offloading", "torchtune", "fsdp")
    assert plan["training"]["activation_offloading"] is True and plan["best"]["strategy"]["pp"] == 1
    assert any(w.startswith("activation offloading (every layer's saved activations)") for w in plan["best"]["prediction"]["warnings"])
    assert "offload_exposed" in plan["best"]["prediction"]["breakdown_s"]


def test_the_8_bit_adamw_is_planned_from_the_page(browser, live_server):
    """The 8-bit AdamW chosen in the optimizer list: an FSDP plan keeps it; under Megatron-Core
    (whose 8-bit state is the precision-aware optimizer's) it is refused next to the control."""
    plan = refused_then_planned(browser, live_server, "#optimizer", "adamw_8bit", "megatron-core",
                                "training.optimizer: megatron-core: Megatron-Core narrows Adam's moments", "exp_avg_dtype", "fsdp")
    assert plan["training"]["optimizer"] == "adamw_8bit" and plan["best"]["prediction"]["fits"]


def test_muon_is_planned_from_the_page(browser, live_server):
    """Muon chosen in the optimizer list: a Megatron-Core plan keeps it, without sharded weights;
    under FSDP (where it is not priced) it is refused next to the control."""
    plan = refused_then_planned(browser, live_server, "#optimizer", "muon", "fsdp",
                                "training.optimizer: fsdp: no Muon optimizer", "TensorParallelMuon", "megatron-core")
    assert plan["training"]["optimizer"] == "muon" and plan["best"]["strategy"]["zero_stage"] in (0, 1)


def test_the_optimizer_step_inside_the_backward_is_planned_from_the_page(browser, live_server):
    """torchtune's optimizer in the backward chosen on the page: an FSDP plan keeps it with one
    micro-batch a step and no gradients held; under Megatron-Core it is refused next to the control."""
    plan = refused_then_planned(browser, live_server, "#t-opt-in-bwd", "true", "megatron-core",
                                "training.optimizer_in_backward: megatron-core: no optimizer step inside the backward",
                                "optimizer_in_bwd", "fsdp")
    best = plan["best"]
    assert plan["training"]["optimizer_in_backward"] is True and best["strategy"]["pp"] == 1
    assert best["prediction"]["memory_breakdown_GB"][0]["gradients"] == 0.0


def test_a_dpo_reference_model_is_planned_from_the_page(browser, live_server):
    """DPO's frozen reference chosen on the page: an FSDP plan keeps it; under Megatron-Core (whose
    DPO reference the cost model does not price) it is refused next to the control."""
    plan = refused_then_planned(browser, live_server, "#t-ref-model", "true", "megatron-core",
                                "training.reference_model: megatron-core: no frozen reference model", "DPOTrainer", "fsdp")
    assert plan["training"]["reference_model"] is True and plan["best"]["prediction"]["fits"]


def test_megatron_module_offload_is_planned_from_the_page(browser, live_server):
    """Megatron-Core's fine-grained activation offloading: activation offloading without modules
    is refused next to the module list; with core_attn chosen the plan keeps it, and its megatron
    launch writes the flags."""
    d = browser
    small_one_node_form(d, live_server, "megatron-core")
    css(d, "#training-options summary").click()
    Select(css(d, "#t-act-offload")).select_by_value("true")
    modules = css(d, "#t-offload-modules")
    submit_and_expect_error_at(d, modules, "training.offload_modules: Megatron-Core's fine-grained activation offloading",
                               "expert_fc1")
    Select(modules).select_by_value("core_attn")
    assert form_body(d)["training"]["offload_modules"] == ["core_attn"]
    css(d, "#submit-plan").click()
    plan = api(live_server, "GET", f"/v1/plans/{rendered_plan_id(d)}").json()
    assert plan["training"]["offload_modules"] == ["core_attn"] and plan["best"]["strategy"]["recompute"] != "full"
    launch = api(live_server, "GET", f"/v1/plans/{plan['id']}/launch?target=megatron").json()
    assert "--offload-modules core_attn" in launch["files"]["megatron_args.sh"]


def test_lora_is_planned_from_the_page(browser, live_server):
    """A LoRA rank, its layers, dropout and a 4-bit base chosen on the page: under
    Megatron-DeepSpeed (no LoRA) the 422 lands at the rank; under FSDP the plan keeps them, its
    optimizer state the adapters'."""
    d = browser
    small_one_node_form(d, live_server, "megatron-deepspeed")
    css(d, "#training-options summary").click()
    rank = css(d, "#t-lora-rank")
    rank.send_keys("16")
    submit_and_expect_error_at(d, rank, "training.lora_rank: megatron-deepspeed: no LoRA", "PEFT")
    small_one_node_form(d, live_server, "fsdp")
    css(d, "#training-options summary").click()
    css(d, "#t-lora-rank").send_keys("16")
    Select(css(d, "#t-lora-modules")).select_by_value("linear_qkv")
    css(d, "#t-lora-dropout").send_keys("0.05")
    Select(css(d, "#t-lora-base")).select_by_value("nf4")
    assert {k: v for k, v in form_body(d)["training"].items() if k.startswith("lora")} == {
        "lora_rank": 16, "lora_target_modules": ["linear_qkv"], "lora_dropout": 0.05, "lora_base_dtype": "nf4"}
    css(d, "#submit-plan").click()
    plan = api(live_server, "GET", f"/v1/plans/{rendered_plan_id(d)}").json()
    assert plan["training"]["lora_rank"] == 16 and plan["training"]["lora_target_modules"] == ["linear_qkv"]
    assert plan["training"]["lora_base_dtype"] == "nf4"
    assert plan["best"]["prediction"]["memory_breakdown_GB"][0]["optimizer_state"] < 0.1


def test_a_fused_loss_kernel_is_planned_from_the_page(browser, live_server):
    """Liger's fused linear cross-entropy chosen on the page: refused next to the control under
    Megatron-Core, kept by an FSDP plan."""
    plan = refused_then_planned(browser, live_server, "#t-loss-kernel", "liger", "megatron-core",
                                "training.loss_kernel: megatron-core: no liger loss kernel", "Liger Kernel", "fsdp")
    assert plan["training"]["loss_kernel"] == "liger"


def test_transformer_engines_loss_is_planned_from_the_page_under_megatron_core(browser, live_server):
    """Transformer Engine's parallel cross-entropy chosen on the page: refused next to the control
    under FSDP (naming the framework that runs it), kept by a Megatron-Core plan."""
    plan = refused_then_planned(browser, live_server, "#t-loss-kernel", "te", "fsdp",
                                "training.loss_kernel: fsdp: no te loss kernel", "megatron-core", "megatron-core")
    assert plan["training"]["loss_kernel"] == "te"


def test_fp8_weights_chosen_on_the_page_reach_the_request_and_are_refused_at_the_control(browser, live_server):
    """FP8 weights (Megatron-Core's --fp8-param-gather) chosen on the page: the body carries
    fp8_param_gather true, and without FP8 training the 422 lands next to the control."""
    d = browser
    small_one_node_form(d, live_server, "megatron-core")
    css(d, "#training-options summary").click()
    control = css(d, "#t-fp8-param-gather")
    Select(control).select_by_value("true")
    assert form_body(d)["training"]["fp8_param_gather"] is True
    submit_and_expect_error_at(d, control, "training.fp8_param_gather: FP8 weights need FP8 training", "training.dtype fp8")
    Select(control).select_by_value("false")
    assert "fp8_param_gather" not in form_body(d)["training"]


def test_grouped_recompute_is_pinned_from_the_page(browser, live_server):
    """Megatron-Core's uniform recompute over groups of 2 layers pinned on the page: the body
    carries the method and the group, and the stored plan's strategy keeps them."""
    d = browser
    small_one_node_form(d, live_server, "megatron-core")
    fill(css(d, "#c-recompute-layers"), 2)
    Select(css(d, "#c-recompute-method")).select_by_value("uniform")
    assert form_body(d)["constraints"] == {"recompute_num_layers": 2, "recompute_method": "uniform"}
    css(d, "#submit-plan").click()
    strategy = api(live_server, "GET", f"/v1/plans/{rendered_plan_id(d)}").json()["best"]["strategy"]
    assert (strategy["recompute"], strategy["recompute_method"], strategy["recompute_num_layers"]) == ("full", "uniform", 2)


def test_pinned_recompute_modules_are_planned_and_shown_with_the_strategy(browser, live_server):
    d = browser
    small_one_node_form(d, live_server, "megatron-core")
    Select(css(d, "#c-recompute-modules")).select_by_value("layernorm")
    assert form_body(d)["constraints"] == {"recompute_modules": ["layernorm"]}
    css(d, "#submit-plan").click()
    plan_id = rendered_plan_id(d)
    plan = api(live_server, "GET", f"/v1/plans/{plan_id}").json()
    assert plan["best"]["strategy"]["recompute"] == "selective" and plan["best"]["strategy"]["recompute_modules"] == ["layernorm"]
    # a dense model's norms are fused into its GEMMs: the plan says the module changes nothing
    assert any("layernorm: nothing to recompute" in w for w in plan["warnings"])
    knobs = pairs(d, "#strategy > div", "dt", "dd")
    assert knobs["recompute"] == "selective: layernorm"


def test_an_fsdp_plan_pinned_to_recompute_some_of_its_blocks_says_so(browser, live_server):
    """Under fsdp a pinned recompute_num_layers is fms-fsdp's selective_checkpointing: N of the
    layers without a pipeline, not Megatron-Core's first N of each chunk (the block method)."""
    d = browser
    small_one_node_form(d, live_server, "fsdp")
    Select(css(d, "#c-recompute")).select_by_value("full")
    fill(css(d, "#c-recompute-layers"), 6)
    css(d, "#submit-plan").click()
    plan_id = rendered_plan_id(d)
    strategy = api(live_server, "GET", f"/v1/plans/{plan_id}").json()["best"]["strategy"]
    assert (strategy["recompute"], strategy["recompute_num_layers"]) == ("full", 6)
    assert pairs(d, "#strategy > div", "dt", "dd")["recompute"] == "full, 6 layers (the others keep their activations)"
