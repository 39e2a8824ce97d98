"""CLI polish (issue 16): help a person reads, the per-user default database, and the
server URL of `planner launch ID`."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from planner_service.settings import ServiceSettings


@pytest.fixture(scope="module")
def cli():
    from planner_service.cli.main import _register_all, app

    if not any(getattr(c, "name", None) == "launch" for c in app.registered_commands):
        _register_all()
    return app


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
