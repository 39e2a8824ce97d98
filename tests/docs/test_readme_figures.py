"""The README's benchmark sections are what the committed results files say: each block between
``<!-- bench:NAME -->`` markers equals what ``bench/report.py`` renders from
``bench/results/`` (run ``make bench-report`` after a benchmark)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _report():
    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "bench" / "report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REPORT = _report()


@pytest.mark.parametrize("name", sorted(REPORT.SECTIONS))
def test_readme_section_matches_its_results_file(name):
    body = REPORT.SECTIONS[name]()
    assert body is not None, f"bench/results has no file for the README's {name} section"
    readme = (ROOT / "README.md").read_text()
    found = re.search(rf"<!-- bench:{name} -->\n(.*?)<!-- /bench:{name} -->", readme, re.S)
    assert found, f"README.md has no <!-- bench:{name} --> markers"
    assert found.group(1) == body + "\n", f"README's {name} section is stale: run make bench-report"
