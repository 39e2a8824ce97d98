"""Every shell command and curl in README.md and docs/API.md runs, in the documents' order,
against a server this test starts, and none crashes.

For each document: a fresh SQLite database, a working directory holding a copy of
``examples/``, ``planner`` on PATH (this checkout's code) and ``curl`` wrapped so that every
HTTP status it gets is recorded.  The server is the documents' own ``planner serve --host
127.0.0.1 --port 8000``, on a free port instead of 8000 (every ``127.0.0.1:8000`` in a command
is rewritten to it).  Placeholders in angle brackets (``<id>``, ``<job id>``, …) are filled from
the responses of earlier commands, as a reader would copy them.

A command passes when it exits 0, prints no traceback, every HTTP answer it got is below 400
(or one of :data:`ALLOWED_STATUS`), and a curl whose comment starts with a status code (``#
204``) got that code.  ``planner serve`` and ``planner worker`` are started, seen working and
stopped with SIGTERM (exit 0).  The few commands that are not run are listed in
:data:`NOT_RUN` with the reason; that list must match the documents exactly.  docs/API.md must
exercise every route of the OpenAPI schema.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/API.md")
DOC_PORT = "8000"

#: Commands that are not executed, and why.  Keys are the command without its comment.
NOT_RUN = {
    "make run": "installs .venv, then runs `planner serve --host 127.0.0.1 --port 8000`, which this test runs as the documents' server",
    "make test": "runs the whole test suite, this test included",
    "export DATABASE_URL=postgresql+psycopg://planner@db.example:5432/planner": "needs a PostgreSQL server (tests/service run on one when PLANNER_TEST_DATABASE_URL is set); the commands after it run on SQLite",
}

#: Statuses a command may get besides 2xx, because the document says so.
ALLOWED_STATUS = {
    # cancelling a job that already ended is a documented 409; whether the job is still
    # running when the command runs depends on the machine's speed
    "-X DELETE http://127.0.0.1:8000/v1/jobs/": {409},
}

LONG_RUNNING = ("planner serve", "planner worker")
COMMAND_TIMEOUT_S = 300


# ───────────── reading the documents ─────────────


def split_commands(block: str) -> list[str]:
    """The block's commands as bash reads them: a command continues over a trailing backslash,
    an open quote and a here-document; lines that are only a comment are dropped."""
    commands: list[str] = []
    lines = block.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].strip() or lines[i].lstrip().startswith("#"):
            i += 1
            continue
        buf: list[str] = []
        quote: str | None = None
        heredoc: str | None = None
        while i < len(lines):
            line = lines[i]
            buf.append(line)
            i += 1
            if heredoc is not None:
                if line.strip() == heredoc:
                    heredoc = None
                    break
                continue
            quote, continued, heredoc = _scan(line, quote)
            if quote is None and not continued and heredoc is None:
                break
        commands.append("\n".join(buf))
    return commands


def _scan(line: str, quote: str | None) -> tuple[str | None, bool, str | None]:
    """(open quote at the end of ``line``, ends with a line continuation, here-document
    delimiter opened on it)."""
    heredoc = None
    j = 0
    while j < len(line):
        c = line[j]
        if quote == "'":
            if c == "'":
                quote = None
        elif quote == '"':
            if c == "\\":
                j += 1
            elif c == '"':
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "\\":
            if j == len(line) - 1:
                return None, True, heredoc
            j += 1
        elif c == "#" and (j == 0 or line[j - 1] in " \t;"):
            break
        elif line.startswith("<<", j):
            m = re.match(r"<<-?\s*(['\"]?)(\w+)\1", line[j:])
            if m:
                heredoc = m.group(2)
                j += m.end() - 1
        j += 1
    return quote, False, heredoc


def strip_comment(command: str) -> str:
    """The command up to its first comment (enough to match one-line commands)."""
    first = command.strip()
    out, quote = [], None
    for j, c in enumerate(first):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (j == 0 or first[j - 1] in " \t;"):
            break
        out.append(c)
    return "".join(out).strip()


def trailing_status(command: str) -> int | None:
    """The status a one-line command's comment promises (``# 204; 404 if unknown`` → 204)."""
    if "\n" in command.strip():
        return None
    comment = command.strip()[len(strip_comment(command)):].strip()
    m = re.match(r"#\s*(\d{3})\b", comment)
    return int(m.group(1)) if m else None


def doc_commands(doc: str) -> list[tuple[str, str]]:
    """[(language, command)] of ``doc`` in order: shell commands, and each python block whole."""
    text = (REPO / doc).read_text()
    pattern = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
    out: list[tuple[str, str]] = []
    for m in pattern.finditer(text):
        lang, body = m.group(1), m.group(2)
        if lang in ("sh", "bash", "shell"):
            out += [("sh", c) for c in split_commands(body)]
        elif lang == "python":
            out.append(("python", body))
    return out


# ───────────── running them ─────────────


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Workspace:
    """Where one document's commands run."""

    root: Path
    port: int
    env: dict[str, str]
    curl_log: Path
    server_log: Path
    values: dict[str, str] = field(default_factory=dict)
    transcript: list[str] = field(default_factory=list)
    server: subprocess.Popen | None = None
    schema: dict = field(default_factory=dict)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def make_workspace(tmp_path: Path) -> Workspace:
    root = tmp_path / "work"
    shutil.copytree(REPO / "examples", root / "examples")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    planner = bin_dir / "planner"
    planner.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m planner_service.cli "$@"\n')
    curl_log = tmp_path / "curl"
    curl_log.mkdir()
    real_curl = shutil.which("curl")
    assert real_curl, "the docs test needs curl"
    curl = bin_dir / "curl"
    curl.write_text(f'#!/bin/sh\nexec "{real_curl}" -D "$DOCS_CURL_LOG/$(date +%s%N).headers" "$@"\n')
    for exe in (planner, curl):
        exe.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
        "DATABASE_URL": f"sqlite:///{tmp_path / 'planner.db'}",
        "HOME": str(tmp_path / "home"),
        "XDG_DATA_HOME": str(tmp_path / "home" / "data"),
        "DOCS_CURL_LOG": str(curl_log),
        "COLUMNS": "120",
        "PLANNER_SOLVER_TIME_LIMIT_S": os.environ.get("PLANNER_SOLVER_TIME_LIMIT_S", "2.0"),
    }
    env.pop("PLANNER_SERVER_URL", None)
    return Workspace(root=root, port=free_port(), env=env, curl_log=curl_log, server_log=tmp_path / "server.log")


def wait_ready(base: str, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited with {proc.returncode} during start-up")
        try:
            if httpx.get(base + "/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"the server at {base} was not ready within {timeout_s} s")


def stop(proc: subprocess.Popen, what: str) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"{what} did not stop within 30 s of SIGTERM") from None
    # uvicorn re-raises the signal it shut down on, so a clean stop of the server is -SIGTERM
    assert rc in (0, -signal.SIGTERM), f"{what} exited with {rc} after SIGTERM"


def start_server(ws: Workspace) -> None:
    log = ws.server_log.open("w")
    ws.server = subprocess.Popen(
        ["planner", "serve", "--host", "127.0.0.1", "--port", str(ws.port), "--log-level", "info"],
        cwd=ws.root, env=ws.env, stdout=log, stderr=subprocess.STDOUT,
    )
    wait_ready(ws.base, ws.server)


PLACEHOLDER = re.compile(r"<([a-z][a-z _]*)>")


def substitute(ws: Workspace, command: str) -> str:
    out = command.replace(f"127.0.0.1:{DOC_PORT}", f"127.0.0.1:{ws.port}")

    def fill(m: re.Match) -> str:
        name = m.group(1)
        assert name in ws.values, f"{command!r} uses <{name}>, which no earlier command's response gave (known: {sorted(ws.values)})"
        return ws.values[name]

    return PLACEHOLDER.sub(fill, out)


def learn(ws: Workspace, stdout: str) -> None:
    """Remember the ids a reader would copy from a response."""
    text = stdout
    if text.startswith("HTTP/"):
        text = text.split("\r\n\r\n", 1)[-1] if "\r\n\r\n" in text else text.split("\n\n", 1)[-1]
    try:
        body = json.loads(text)
    except ValueError:
        return
    if not isinstance(body, dict):
        return
    ident = body.get("id")
    if isinstance(ident, str):
        if "request_hash" in body:
            ws.values.setdefault("id", ident)
            if body.get("parent_id"):
                ws.values["replan id"] = ident
        elif body.get("kind") and "progress" in body:
            ws.values["job id"] = ident
        elif body.get("format") == "onnx":
            ws.values["model id"] = ident
        elif "fit" in body and "device" in body:
            ws.values["profile id"] = ident
    if body.get("next_cursor"):
        ws.values["next_cursor"] = body["next_cursor"]


def statuses_since(ws: Workspace, seen: set[str]) -> list[int]:
    codes = []
    for path in sorted(ws.curl_log.iterdir()):
        if path.name in seen:
            continue
        seen.add(path.name)
        # one header block per response (several for a 100-continue); the last one counts
        lines = [ln for ln in path.read_text().splitlines() if ln.startswith("HTTP/")]
        if lines:
            codes.append(int(lines[-1].split()[1]))
    return codes


def run_long_running(ws: Workspace, command: str) -> str:
    """Start ``planner serve``/``planner worker``, see it work, stop it."""
    cmd = substitute(ws, strip_comment(command))
    port = None
    if cmd.startswith("planner serve"):
        port = free_port()
        cmd = re.sub(r"--port\s+\d+", "", cmd) + f" --port {port}"
    env, headers = ws.env, {}
    if port is not None and "--host 127.0.0.1" not in cmd:
        # Off loopback the server needs keys (it refuses PLANNER_AUTH=disabled): make one.
        env = {**ws.env, "PLANNER_AUTH": "enabled"}
        made = subprocess.run(["planner", "keys", "create", "--tenant", "docs"], cwd=ws.root, env=env, capture_output=True, text=True, check=True)
        headers = {"Authorization": f"Bearer {made.stdout.strip()}"}
    proc = subprocess.Popen(["bash", "-c", f"exec {cmd}"], cwd=ws.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        if port is not None:
            wait_ready(f"http://127.0.0.1:{port}", proc)
            assert httpx.get(f"http://127.0.0.1:{port}/v1/presets", headers=headers, timeout=10).status_code == 200
        else:
            time.sleep(2.0)
            assert proc.poll() is None, f"{cmd!r} exited at once with {proc.returncode}"
        stop(proc, repr(cmd))
    finally:
        if proc.poll() is None:
            proc.kill()
    out = proc.stdout.read() if proc.stdout else ""
    assert "Traceback" not in out, out
    return out


def run_command(ws: Workspace, lang: str, command: str, seen: set[str]) -> None:
    if lang == "python":
        cmd = [sys.executable, "-c", command]
        shown = command
    else:
        shown = substitute(ws, command)
        cmd = ["bash", "-e", "-o", "pipefail", "-c", shown]
    proc = subprocess.run(cmd, cwd=ws.root, env=ws.env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    ws.transcript.append(f"$ {shown}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    where = f"{shown!r}\nstdout: {proc.stdout[-3000:]}\nstderr: {proc.stderr[-3000:]}"
    assert proc.returncode == 0, f"exit code {proc.returncode}: {where}"
    assert "Traceback" not in proc.stdout + proc.stderr, where
    codes = statuses_since(ws, seen)
    allowed = set().union(*(v for k, v in ALLOWED_STATUS.items() if k in command))
    promised = trailing_status(command)
    if promised is not None:
        allowed.add(promised)
    bad = [c for c in codes if c >= 400 and c not in allowed]
    assert not bad, f"HTTP {bad}: {where}"
    if promised is not None:
        assert codes and codes[-1] == promised, f"the comment says {promised}, the server said {codes}: {where}"
    learn(ws, proc.stdout)


def run_document(doc: str, tmp_path: Path) -> Workspace:
    ws = make_workspace(tmp_path)
    start_server(ws)
    seen: set[str] = set()
    try:
        for lang, command in doc_commands(doc):
            key = strip_comment(command)
            if key in NOT_RUN:
                continue
            if lang == "sh" and key.startswith(LONG_RUNNING):
                run_long_running(ws, command)
                continue
            run_command(ws, lang, command, seen)
        ws.schema = httpx.get(ws.base + "/openapi.json", timeout=30).json()
    finally:
        (tmp_path / "transcript.txt").write_text("\n\n".join(ws.transcript))
        if ws.server.poll() is None:
            ws.server.send_signal(signal.SIGTERM)
            ws.server.wait(30)
    return ws


# ───────────── the tests ─────────────


def test_the_command_splitter_reads_what_bash_reads():
    block = (
        "# a comment line\n"
        "curl -s -X POST http://x/v1 -H 'A: b' \\\n  -d '{\n  \"a\": 1\n}'   # trailing\n"
        "cat > f.json <<'EOF'\n{\"x\": \"it's\"}\nEOF\n"
        "planner serve   # long running\n"
    )
    cmds = split_commands(block)
    assert len(cmds) == 3, cmds
    assert cmds[0].endswith("}'   # trailing") and cmds[1].endswith("EOF")
    assert strip_comment(cmds[2]) == "planner serve"
    assert trailing_status("curl -s -X DELETE http://x/v1/plans/a   # 204; 404 if unknown") == 204
    assert trailing_status("curl -s http://x/readyz   # {\"status\":\"ready\"} or 503") is None


def test_not_run_lists_only_commands_the_documents_have():
    keys = {strip_comment(c) for doc in DOCS for lang, c in doc_commands(doc) if lang == "sh"}
    assert set(NOT_RUN) <= keys, sorted(set(NOT_RUN) - keys)
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^run:.*\n\t\S*planner serve --host 127\.0\.0\.1 --port 8000$", makefile, re.MULTILINE), "make run is no longer `planner serve`"


def test_every_example_file_the_documents_name_is_shipped():
    text = "\n".join((REPO / doc).read_text() for doc in DOCS)
    named = set(re.findall(r"\bexamples/[\w.*-]+", text))
    assert named, "the documents name no example files"
    for name in named:
        assert list(REPO.glob(name)), f"{name} is named in the docs but not shipped"


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("doc", DOCS)
def test_every_documented_command_runs(doc, tmp_path):
    ws = run_document(doc, tmp_path)
    if doc == "docs/API.md":
        routes = exercised_routes(ws.server_log.read_text())
        missing = [f"{m} {p}" for m, p in api_operations(ws.schema) if not any(m == rm and path_matches(p, rp) for rm, rp in routes)]
        assert not missing, f"docs/API.md has no command for: {missing}"


def api_operations(schema: dict) -> list[tuple[str, str]]:
    return [(m.upper(), p) for p, ops in schema["paths"].items() for m in ops if m in ("get", "post", "put", "delete", "patch")]


def exercised_routes(log: str) -> set[tuple[str, str]]:
    # the server logs JSON lines (PLANNER_LOG_FORMAT=json): the access line is the message
    log = "\n".join(json.loads(ln).get("message", "") if ln.startswith("{") else ln for ln in log.splitlines())
    return {(m.group(1), m.group(2).split("?")[0]) for m in re.finditer(r'"(GET|POST|PUT|DELETE|PATCH) (\S+) HTTP/[\d.]+" \d{3}', log)}


def path_matches(template: str, path: str) -> bool:
    return re.fullmatch(re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)), path) is not None


def test_estimate_json_is_the_api_object_in_the_cli_and_in_every_batch_line(tmp_path):
    """``planner estimate FILE --json`` prints exactly what POST /v1/estimate answers; each
    ``--batch`` line has the same fields."""
    from fastapi.testclient import TestClient
    from typer.testing import CliRunner

    from planner_service.api import create_app
    from planner_service.cli.main import _register_all, app
    from planner_service.settings import ServiceSettings

    _register_all()
    request = REPO / "examples" / "estimate_gpt3_175b.json"
    with TestClient(create_app(ServiceSettings(database_url=f"sqlite:///{tmp_path / 'e.db'}"), start_worker=False)) as client:
        r = client.post("/v1/estimate", json=json.loads(request.read_text()))
        assert r.status_code == 200, r.text
        http = r.json()
        batch_http = [client.post("/v1/estimate", json=json.loads(line)).json() for line in (REPO / "examples" / "requests.jsonl").read_text().splitlines()]
    runner = CliRunner()
    one = runner.invoke(app, ["estimate", str(request), "--json"])
    assert one.exit_code == 0, one.output
    assert json.loads(one.stdout) == http
    batch = runner.invoke(app, ["estimate", "--batch", str(REPO / "examples" / "requests.jsonl"), "--json"])
    assert batch.exit_code == 0, batch.output
    lines = [json.loads(line) for line in batch.stdout.splitlines()]
    assert lines == batch_http and all(set(line) == set(http) for line in lines)
    table = runner.invoke(app, ["estimate", str(request)])
    assert table.exit_code == 0, table.output
    assert "gpt3-175b on selene-128 with dp 16, tp 8, pp 8" in " ".join(table.stdout.split()) and "'dp'" not in table.stdout
