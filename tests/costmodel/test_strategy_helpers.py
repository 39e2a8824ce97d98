"""The one even split and the one rank formula (``cost_model.strategy``)."""

from __future__ import annotations

import itertools

import pytest

from cost_model.strategy import RankCoords, even_split, rank_coords, rank_of


@pytest.mark.parametrize(
    ("total", "parts", "expected"),
    [(32, 4, (8, 8, 8, 8)), (30, 4, (8, 8, 7, 7)), (3, 5, (1, 1, 1, 0, 0)), (7, 1, (7,)), (0, 2, (0, 0))],
)
def test_even_split(total: int, parts: int, expected: tuple[int, ...]) -> None:
    assert even_split(total, parts) == expected


def test_even_split_rejects_no_parts() -> None:
    with pytest.raises(ValueError):
        even_split(4, 0)


@pytest.mark.parametrize(("dp", "cp", "tp", "pp"), [(1, 1, 1, 1), (2, 1, 4, 2), (3, 2, 2, 2), (2, 2, 1, 3)])
def test_rank_formula_is_megatron_order(dp: int, cp: int, tp: int, pp: int) -> None:
    # Megatron's order is nested loops with tp innermost: the n-th tuple visited is rank n.
    visited = itertools.product(range(pp), range(dp), range(cp), range(tp))
    for n, (pp_i, dp_i, cp_i, tp_i) in enumerate(visited):
        assert rank_of(pp_i, dp_i, cp_i, tp_i, dp=dp, cp=cp, tp=tp) == n
        assert rank_coords(n, dp=dp, cp=cp, tp=tp) == RankCoords(pp=pp_i, dp=dp_i, cp=cp_i, tp=tp_i)
