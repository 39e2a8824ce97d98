"""The Megatron launch's words and what Megatron-LM's own parser makes of them: an argparse
built from its argument table (``planner_service/reference/megatron_arguments.json``: dest,
nargs, type, choices), the nearest check of the real parser (Megatron-LM does not install here)."""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from planner_service.exporters import LaunchParams, render
from planner_service.exporters.frameworks import megatron_choices, megatron_reference


def megatron_words(plan: dict[str, Any]) -> list[str]:
    """The MEGATRON_ARGS words of the plan's ``megatron`` launch."""
    text = render(plan, "megatron", LaunchParams(image="img", command="pretrain_gpt.py", smoke_test=False)).files["megatron_args.sh"]
    return shlex.split(text[text.index("MEGATRON_ARGS=(") + len("MEGATRON_ARGS=("): text.rindex(")")])


def parse_as_megatron(words: list[str]) -> argparse.Namespace:
    """``words`` through Megatron-LM's declared flags (only those the words use: an unknown flag
    is a KeyError, a value outside its choices argparse's error)."""
    ref = megatron_reference()
    parser = argparse.ArgumentParser()
    for flag in {w for w in words if w.startswith("--")}:
        info = ref[flag]
        if info.get("flag_only"):
            parser.add_argument(flag, dest=info["dest"], action="store_true")
        else:
            parser.add_argument(flag, dest=info["dest"], nargs=info.get("nargs"), choices=megatron_choices(info) or None,
                                type=int if info.get("type") == "int" else str)
    return parser.parse_args(words)
