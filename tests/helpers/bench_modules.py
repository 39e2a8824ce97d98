"""The bench scripts the tests import (they are scripts, not a package): loaded from their file."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

BENCH = Path(__file__).resolve().parents[2] / "bench"


def cpu_validation(monkeypatch: Any) -> ModuleType:
    """bench/cpu_validation.py as a module (its dataclasses look their module up in
    ``sys.modules``, set for the test by ``monkeypatch``)."""
    spec = importlib.util.spec_from_file_location("bench_cpu_validation", BENCH / "cpu_validation.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module
