"""What both model families offer the planner and the service: a display name and parameter counts.

:class:`cost_model.transformer.spec.TransformerSpec` (layer-level) and
:class:`cost_model.graph.ir.GraphSpec` (operator graph) both satisfy :class:`ModelSpec`, so the
plan service stores a plan's model name and size without asking which family it is.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class ModelSpec(Protocol):
    """A model the planner can plan."""

    @property
    def name(self) -> str:
        """The display name (a preset's, a config's or an uploaded graph's)."""
        ...

    def total_params(self) -> int:
        """Every trainable parameter (count)."""
        ...

    def active_params(self) -> int:
        """Parameters touched per token (count; below :meth:`total_params` only for MoE)."""
        ...
