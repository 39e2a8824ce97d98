"""Strings and parser limits at the edge: NUL, lone surrogates, over-long values, non-UTF-8
bodies, huge number literals and deep nesting are 4xx naming the field (or ``body``), on every
database, and nothing reaches the planner or a column.  Callback URLs: the refusal table."""

from __future__ import annotations

import logging
import socket

import pytest

from helpers.requests import SMALL_CLUSTER, small_request
from planner_service.service.worker import CallbackRefused, resolve_callback
from planner_service.settings import ServiceSettings

ZERO = "00000000-0000-0000-0000-000000000000"
NUL_NAME = {**SMALL_CLUSTER, "name": "a\u0000b"}

# (id, method, url, body: dict → JSON, bytes → raw, status, field)
CASES = [
    ("plan-id-nul", "GET", "/v1/plans/%00", None, 404, "path"),
    ("plan-id-not-uuid", "GET", "/v1/plans/abc", None, 404, "id"),
    ("job-id-nul", "GET", "/v1/jobs/x%00y", None, 404, "path"),
    ("job-id-not-uuid", "DELETE", "/v1/jobs/abc", None, 404, "id"),
    ("model-id-not-uuid", "GET", "/v1/models/abc'--", None, 404, "model_id"),
    ("profile-id-not-uuid", "GET", "/v1/profiles/abc%27", None, 404, "profile_id"),
    ("cluster-name-bad", "GET", "/v1/clusters/a%20b", None, 404, "name"),
    ("cluster-delete-bad", "DELETE", "/v1/clusters/%C3%A9", None, 404, "name"),
    ("launch-unknown-plan", "GET", f"/v1/plans/{ZERO}/launch?target=torchrun", None, 404, "id"),
    ("filter-model-nul", "GET", "/v1/plans?model=%00", None, 422, "model"),
    ("filter-cluster-nul", "GET", "/v1/plans?cluster=a%00", None, 422, "cluster"),
    ("filter-device-nul", "GET", "/v1/plans?device=%00", None, 422, "device"),
    ("filter-hash-nul", "GET", "/v1/plans?request_hash=%00", None, 422, "request_hash"),
    ("filter-hash-format", "GET", "/v1/plans?request_hash=abc", None, 422, "request_hash"),
    ("filter-parent-nul", "GET", "/v1/plans?parent_id=%00", None, 422, "parent_id"),
    ("filter-parent-format", "GET", "/v1/plans?parent_id=abc", None, 422, "parent_id"),
    ("filter-model-long", "GET", "/v1/plans?model=" + "m" * 300, None, 422, "model"),
    ("query-not-utf8", "GET", "/v1/plans?model=%ff", None, 422, "query"),
    ("query-too-long", "GET", "/v1/plans?model=" + "m" * 5000, None, 422, "model"),
    ("cursor-garbage", "GET", "/v1/plans?cursor=%00", None, 422, "cursor"),
    ("profiles-device-nul", "GET", "/v1/profiles?device=%00", None, 422, "device"),
    ("body-not-utf8", "POST", "/v1/plans", b'{"model": "\xff"}', 422, "body"),
    ("body-huge-int", "POST", "/v1/plans", b'{"top_k": 1' + b"0" * 5000 + b"}", 422, "body"),
    ("body-huge-float", "POST", "/v1/plans", b'{"top_k": 1e999}', 422, "body"),
    ("body-nan", "POST", "/v1/plans", b'{"top_k": NaN}', 422, "body"),
    ("body-deep-1001", "POST", "/v1/plans", b"[" * 1001 + b"]" * 1001, 422, "body"),
    ("body-deep-100k", "POST", "/v1/estimate", b"[" * 100_000, 422, "body"),
    ("body-deep-65", "POST", "/v1/plans", b'{"a":' * 65 + b"1" + b"}" * 65, 422, "body"),
    ("cluster-name-nul", "POST", "/v1/plans", small_request(cluster=NUL_NAME), 422, "cluster.name"),
    ("cluster-name-surrogate", "POST", "/v1/plans", b'{"model": {"preset": "gpt3-125m"}, "training": {"global_batch_size": 64, "sequence_length": 2048}, "cluster": {"name": "\\ud800", "node_groups": []}}', 422, "cluster.name"),
    ("model-name-nul", "POST", "/v1/plans", small_request(model={"preset": "gpt3-125m", "name": "x\u0000"}), 422, "model.name"),
    ("hostname-nul", "POST", "/v1/plans", small_request(cluster={**SMALL_CLUSTER, "node_groups": [{**SMALL_CLUSTER["node_groups"][0], "hostnames": ["n\u0000"]}]}), 422, "cluster.node_groups[0].hostnames[0]"),
    ("key-nul", "POST", "/v1/plans", {"a\u0000": 1}, 422, "body"),
    ("string-too-long", "POST", "/v1/estimate", {"model": {"preset": "x" * 100_001}}, 422, "model.preset"),
    ("estimate-surrogate", "POST", "/v1/estimate", b'{"model": {"preset": "\\udc00"}}', 422, "model.preset"),
    ("save-cluster-nul", "PUT", "/v1/clusters/ok", NUL_NAME, 422, "name"),
    ("save-cluster-name-nul", "POST", "/v1/clusters", {"name": "a\u0000", "cluster": SMALL_CLUSTER}, 422, "name"),
    ("profile-device-nul", "POST", "/v1/profiles", {"schema": "planner-profile", "schema_version": 1, "device": {"name": "x\u0000"}, "measurements": []}, 422, "device.name"),
    ("profile-text-plain-surrogate", "POST", "/v1/profiles", b'{"device": {"name": "\\ud800"}}', 422, "device.name"),
    ("import-text-nul", "POST", "/v1/clusters/import?format=nvidia-smi&filename=n0", b"index, name\n0, A\x00100\n", 422, "body"),
    ("import-name-nul", "POST", "/v1/clusters/import?format=nvidia-smi&name=%00", b"x", 422, "name"),
    ("callback-off", "POST", "/v1/plans", small_request(**{"async": True, "callback_url": "https://hooks.example.org/x"}), 422, "callback_url"),
    ("callback-metadata", "POST", "/v1/plans", small_request(**{"async": True, "callback_url": "http://169.254.169.254/latest"}), 422, "callback_url"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_edge_input_is_a_4xx_with_its_field(client, case, caplog):
    _id, method, url, body, status, field = case
    kw = {"content": body, "headers": {"Content-Type": "application/json"}} if isinstance(body, bytes) else ({"json": body} if body is not None else {})
    with caplog.at_level(logging.INFO):
        r = client.request(method, url, **kw)
    assert r.status_code == status, (r.status_code, r.text[:300])
    assert r.json()["error"]["field"] == field, r.json()
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert "Traceback" not in caplog.text


def _resolver(*addresses: str):
    def resolve(host, port, type=0):  # noqa: A002 - getaddrinfo's keyword
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in addresses]

    return resolve


ALLOWED = "hooks.example.org,169.254.169.254,127.0.0.1,10.1.2.3,metadata.google.internal,0x7f000001,localhost,[::1]"
REFUSALS = [
    ("http://169.254.169.254/latest/meta-data", ["169.254.169.254"], "metadata"),
    ("http://metadata.google.internal/", ["169.254.169.254"], "metadata"),
    ("http://hooks.example.org/x", ["10.0.0.7"], "private"),
    ("http://hooks.example.org/x", ["127.0.0.1"], "loopback"),
    ("http://hooks.example.org/x", ["93.184.216.34", "192.168.1.1"], "private"),
    ("http://hooks.example.org/x", ["::1"], "loopback"),
    ("http://hooks.example.org/x", ["::ffff:127.0.0.1"], "loopback"),
    ("http://hooks.example.org/x", ["fe80::1"], "link-local"),
    ("http://hooks.example.org/x", ["0.0.0.0"], "unspecified"),
    ("http://localhost:5432/", ["127.0.0.1"], "loopback"),
    ("http://0x7f000001/", ["127.0.0.1"], "loopback"),
    ("http://[::1]:8000/", ["::1"], "loopback"),
    ("http://other.example.org/x", ["93.184.216.34"], "not in PLANNER_CALLBACK_ALLOWED_HOSTS"),
    ("ftp://hooks.example.org/x", ["93.184.216.34"], "http(s)"),
    ("http://user:pw@hooks.example.org/x", ["93.184.216.34"], "user information"),
]


@pytest.mark.parametrize("url,addresses,reason", REFUSALS)
def test_callback_refusals(url, addresses, reason):
    s = ServiceSettings(callback_allowed_hosts=ALLOWED)
    with pytest.raises(CallbackRefused, match=reason.replace("(", r"\(").replace(")", r"\)")):
        resolve_callback(url, s, resolver=_resolver(*addresses))


def test_callback_public_address_is_pinned_and_private_needs_opt_in():
    s = ServiceSettings(callback_allowed_hosts="hooks.example.org")
    pinned, host = resolve_callback("https://hooks.example.org/a?b=1", s, resolver=_resolver("93.184.216.34"))
    assert pinned == "https://93.184.216.34:443/a?b=1" and host == "hooks.example.org"
    private = ServiceSettings(callback_allowed_hosts="hooks.example.org", callback_allow_private=True)
    assert resolve_callback("http://hooks.example.org/", private, resolver=_resolver("10.0.0.7"))[0] == "http://10.0.0.7:80/"
    with pytest.raises(CallbackRefused, match="metadata"):
        resolve_callback("http://hooks.example.org/", private, resolver=_resolver("169.254.169.254"))
    assert ServiceSettings().callback_host_list == ()  # default: callbacks off
