"""storage.rank_table: a rank table held as columns gives back exactly the rows it was built
from, as rows, as JSON text and as stored; moved ranks counted over its arrays equal the count
over the rows."""

from __future__ import annotations

import json
import random

import pytest

from planner_service.service.replan import _hosts_in_rank_order, ranks_moved
from planner_service.storage.rank_table import (
    RankTable,
    decode_rank_tables,
    dumps_with_tables,
    encode_rank_tables,
)


def _dumps(value):
    return json.dumps(value, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode("utf-8")


def _rows(n, hosts=None, gpn=4, seed=0):
    rng = random.Random(seed)
    hosts = hosts or [f"node-{k}" for k in range(-(-n // gpn))]
    return [{"rank": r, "host": hosts[r // gpn], "gpu": r % gpn, "node_group": "g0", "device": "H100-SXM5-80GB",
             "stage": r % 3, "dp": rng.randrange(5), "pp": r % 3, "tp": 0, "cp": 2**40 if r == 7 else 0} for r in range(n)]


def test_rows_json_and_stored_form_round_trip():
    rows = _rows(50, hosts=["a", 'b"q', "c\\d", "ü-%s-%d", "e\nf", "f", "g", "h", "i", "j", "k", "l", "m"])
    table = RankTable.from_rows(rows)
    assert table is not None and len(table) == 50
    assert table.rows() == rows and list(table) == rows and table[3] == rows[3] and table == rows
    assert table.json_bytes() == _dumps(rows)
    stored = json.loads(json.dumps(encode_rank_tables({"best": {"ranks": table}, "alternatives": [{"ranks": table}]})))
    assert stored["best"]["ranks"]["encoding"] == "rank_table/v1"
    back = decode_rank_tables(stored)
    assert isinstance(back["best"]["ranks"], RankTable) and back["best"]["ranks"].rows() == rows
    assert back["alternatives"][0]["ranks"].json_bytes() == _dumps(rows)


@pytest.mark.parametrize("bad", [
    lambda rows: rows[1].update(gpu=True),  # bool is not int
    lambda rows: rows[2].update(host=None),
    lambda rows: rows[3].pop("cp"),
    lambda rows: rows.__setitem__(4, {k: rows[4][k] for k in reversed(list(rows[4]))}),  # another key order
    lambda rows: rows[5].update(dp=1.5),
])
def test_rows_that_are_not_one_table_stay_a_list(bad):
    rows = _rows(20)
    bad(rows)
    assert RankTable.from_rows(rows) is None
    assert encode_rank_tables({"best": {"ranks": rows}})["best"]["ranks"] == rows


def test_a_small_plain_list_is_stored_as_it_is():
    rows = _rows(8)
    assert encode_rank_tables({"best": {"ranks": rows}})["best"]["ranks"] is rows


def test_plan_json_with_tables_is_the_plain_json():
    rows = _rows(40)
    body = {"id": "x", "best": {"strategy": {"dp": 2}, "ranks": RankTable.from_rows(rows)},
            "alternatives": [{"ranks": RankTable.from_rows(rows[:12])}, {"ranks": []}], "note": "\x00"}
    plain = {**body, "best": {**body["best"], "ranks": rows}, "alternatives": [{"ranks": rows[:12]}, {"ranks": []}]}
    assert dumps_with_tables(body) == _dumps(plain)
    # a value of the plan equal to the placeholder: written without the splice, still right
    tricky = {**body, "note": "\x00rank-table-0\x00"}
    assert dumps_with_tables(tricky) == _dumps({**plain, "note": "\x00rank-table-0\x00"})
    # a table anywhere else: written as its rows
    assert dumps_with_tables({"other": RankTable.from_rows(rows)}) == _dumps({"other": rows})


def test_moved_ranks_over_arrays_equal_the_count_over_rows():
    rng = random.Random(3)
    for case in range(30):
        n_old, n_new = rng.randrange(1, 60), rng.randrange(1, 60)
        hosts = [f"h{k}" for k in range(20)]
        old = _rows(n_old, hosts=hosts, seed=case)
        new = [dict(r, host=rng.choice(hosts + ["spare-1"]) if rng.random() < 0.3 else r["host"]) for r in _rows(n_new, hosts=hosts)]
        if case % 3 == 0:  # ranks not 0..n-1 in order
            rng.shuffle(new)
            for r in new:
                r["rank"] += 5
        a, b = RankTable.from_rows(old), RankTable.from_rows(new)
        assert ranks_moved(a, b) == ranks_moved(old, new)
        assert _hosts_in_rank_order(b) == _hosts_in_rank_order(new)
