"""Callback URLs: the refusal table.  (Strings and parser limits at the edge — NUL, lone
surrogates, over-long values, non-UTF-8 bodies, huge number literals, deep nesting — are rows of
the bad-input table, ``helpers.bad_inputs``, run by tests/api/test_bad_input.py.)"""

from __future__ import annotations

import socket

import pytest

from planner_service.service.worker import CallbackRefused, resolve_callback
from planner_service.settings import ServiceSettings


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
