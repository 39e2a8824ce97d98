"""A plan's rank table held as columns: how a large one is stored, served and compared.

A plan's ``ranks`` is one flat dict per GPU (``{"rank", "host", "gpu", ...}``): 98,304 of them
on the largest clusters, ~15 MB of JSON that took ~0.3 s to encode and as long to decode each
time a plan was stored, read back, replanned from or served.  :class:`RankTable` holds the same
rows as columns — an integer column as a numpy array, a string column as its distinct values and
each row's index into them — and

* is a read-only sequence of the row dicts (built on first use), so code that reads ``ranks``
  row by row sees the same rows;
* is stored as a small JSON object (:meth:`RankTable.to_stored`, each column zlib-compressed,
  base64): about 100 KB instead of 15 MB, decoded in milliseconds (:func:`decode_rank_tables`);
* renders its JSON text straight from the columns (:meth:`RankTable.json_bytes`), byte for byte
  what ``json.dumps`` of the rows gives with the API's separators, several times faster;
* gives the (host, gpu) of every rank as arrays (:meth:`RankTable.places`) for counting moved
  ranks without building the rows.

Only tables of at least :data:`COMPACT_MIN_RANKS` rows whose rows all have the same keys in the
same order and int or str values are held this way; any other ``ranks`` stays a plain list.
"""

from __future__ import annotations

import base64
import json
import re
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, overload

import numpy as np

#: Rank tables with at least this many rows are stored and served as columns.
COMPACT_MIN_RANKS = 4096

#: The ``encoding`` of a stored rank table.
STORED_ENCODING = "rank_table/v1"

#: Keys that name a rank's host and its GPU on the host, in lookup order (the aliases of
#: ``service.replan``).
HOST_KEYS = ("host", "hostname")
GPU_KEYS = ("gpu", "local_rank", "device_index")

IntColumn = np.ndarray
StrColumn = tuple[tuple[str, ...], np.ndarray]  # (distinct values, index of each row's value)
Column = IntColumn | StrColumn


_NEEDS_ESCAPE = re.compile(r'[\x00-\x1f"\\]')


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def _json_str(value: str) -> str:
    """``json.dumps(value, ensure_ascii=False)`` of a string, without the call where nothing in
    it needs escaping (host names: 12,288 calls per table)."""
    return '"' + value + '"' if _NEEDS_ESCAPE.search(value) is None else _json(value)


class RankTable(Sequence[dict[str, Any]]):
    """Rows of the same keys as columns (module docstring).  Immutable: the rows built on
    first use are shared; callers do not change them."""

    __slots__ = ("_columns", "_count", "_json", "_keys", "_rows")

    def __init__(self, keys: Sequence[str], columns: Mapping[str, Column], count: int) -> None:
        self._keys = tuple(keys)
        if set(columns) != set(self._keys):
            raise ValueError("a column for every key, and only those")
        cols: dict[str, Column] = {}
        for k in self._keys:
            c = columns[k]
            if isinstance(c, tuple):
                values, index = c
                index = np.asarray(index, dtype=np.int64)
                if index.shape != (count,) or (count and (index.min() < 0 or index.max() >= len(values))):
                    raise ValueError(f"column {k!r}: an index into its values for each of the {count} rows")
                cols[k] = (tuple(values), index)
            else:
                arr = np.asarray(c, dtype=np.int64)
                if arr.shape != (count,):
                    raise ValueError(f"column {k!r}: {count} values")
                cols[k] = arr
        self._columns = cols
        self._count = count
        self._rows: list[dict[str, Any]] | None = None
        self._json: bytes | None = None

    # ------------------------------------------------------------------ building
    @classmethod
    def from_rows(cls, rows: Sequence[Any]) -> RankTable | None:
        """The table of ``rows``, or None when they are not flat dicts of the same keys (in the
        same order) with int or str values, one type per key."""
        if not rows or type(rows[0]) is not dict:
            return None
        keys = tuple(rows[0])
        n = len(rows)
        raw: dict[str, list[Any]] = {k: [None] * n for k in keys}
        for i, r in enumerate(rows):
            if type(r) is not dict or len(r) != len(keys) or tuple(r) != keys:
                return None
            for k, v in r.items():
                raw[k][i] = v
        columns: dict[str, Column] = {}
        for k, vals in raw.items():
            kinds = {type(v) for v in vals}
            if kinds == {int}:
                columns[k] = np.asarray(vals, dtype=np.int64)
            elif kinds == {str}:
                distinct = tuple(dict.fromkeys(vals))
                at = {v: j for j, v in enumerate(distinct)}
                columns[k] = (distinct, np.fromiter((at[v] for v in vals), dtype=np.int64, count=n))
            else:
                return None
        return cls(keys, columns, n)

    # ------------------------------------------------------------------ sequence
    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, i: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, i: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, i: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        return self.rows()[i]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RankTable):
            other = other.rows()
        if isinstance(other, list):
            return self.rows() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-looking sequence semantics, as a list

    def __repr__(self) -> str:
        return f"RankTable({self._count} rows, keys={list(self._keys)})"

    @property
    def keys(self) -> tuple[str, ...]:
        return self._keys

    def _lists(self) -> list[list[Any]]:
        """Each column's values, one Python list per key."""
        out = []
        for k in self._keys:
            c = self._columns[k]
            if isinstance(c, tuple):
                values, index = c
                out.append([values[j] for j in index.tolist()])
            else:
                out.append(c.tolist())
        return out

    def rows(self) -> list[dict[str, Any]]:
        """The rows as dicts (built once)."""
        if self._rows is None:
            keys = self._keys
            self._rows = [dict(zip(keys, vals, strict=True)) for vals in zip(*self._lists(), strict=True)]
        return self._rows

    def to_list(self) -> list[dict[str, Any]]:
        """A plain list of copies of the rows (for a caller that changes them)."""
        return [dict(r) for r in self.rows()]

    # ------------------------------------------------------------------ columns
    def int_column(self, key: str) -> np.ndarray | None:
        c = self._columns.get(key)
        return c if isinstance(c, np.ndarray) else None

    def str_column(self, key: str) -> StrColumn | None:
        c = self._columns.get(key)
        return c if isinstance(c, tuple) else None

    def distinct(self, key: str) -> list[Any]:
        """The distinct values of column ``key`` the rows hold."""
        c = self._columns[key]
        if isinstance(c, tuple):
            values, index = c
            return [values[int(j)] for j in np.unique(index)]
        return np.unique(c).tolist()

    def places(self) -> tuple[np.ndarray, tuple[str, ...], np.ndarray, np.ndarray] | None:
        """(rank of each row, distinct host names, host index of each row, GPU of each row), or
        None when the table has no rank, host or GPU column of those types."""
        rank = self.int_column("rank")
        host = next((self.str_column(k) for k in HOST_KEYS if k in self._columns), None)
        gpu = next((self.int_column(k) for k in GPU_KEYS if k in self._columns), None)
        if rank is None or host is None or gpu is None:
            return None
        return rank, host[0], host[1], gpu

    # ------------------------------------------------------------------ JSON
    def json_bytes(self) -> bytes:
        """The rows' JSON, as ``json.dumps(rows, ensure_ascii=False, separators=(",", ":"))``
        writes it (and Starlette's ``JSONResponse`` sends it), UTF-8; built once."""
        if self._json is None:
            if not self._count:
                self._json = b"[]"
                return self._json
            parts: list[str] = []
            args: list[list[Any]] = []
            for k in self._keys:
                c = self._columns[k]
                head = _json(k).replace("%", "%%") + ":"
                if isinstance(c, tuple):
                    values, index = c
                    if len(values) == 1:  # one value on every row: written into the template
                        parts.append(head + _json(values[0]).replace("%", "%%"))
                        continue
                    encoded = [_json_str(v) for v in values]
                    args.append([encoded[j] for j in index.tolist()])
                    parts.append(head + "%s")
                else:
                    args.append(c.tolist())
                    parts.append(head + "%d")
            template = "{" + ",".join(parts) + "}"
            if args:
                text = ",".join([template % row for row in zip(*args, strict=True)])
            else:
                text = ",".join([template] * self._count)
            self._json = ("[" + text + "]").encode("utf-8")
        return self._json

    def to_stored(self) -> dict[str, Any]:
        """The JSON object the table is stored as (:func:`from_stored` reads it back)."""
        cols: dict[str, Any] = {}
        for k in self._keys:
            c = self._columns[k]
            if isinstance(c, tuple):
                values, index = c
                cols[k] = {"values": list(values), **_packed(index)}
            else:
                cols[k] = _packed(c)
        return {"encoding": STORED_ENCODING, "count": self._count, "keys": list(self._keys), "columns": cols}

    @classmethod
    def from_stored(cls, data: Mapping[str, Any]) -> RankTable:
        count = int(data["count"])
        cols: dict[str, Column] = {}
        for k in data["keys"]:
            c = data["columns"][k]
            arr = _unpacked(c, count)
            cols[k] = (tuple(c["values"]), arr) if "values" in c else arr
        return cls(data["keys"], cols, count)


def _packed(a: np.ndarray) -> dict[str, Any]:
    dtype = "<i4" if a.size == 0 or (a.min() >= -(2**31) and a.max() < 2**31) else "<i8"
    return {"dtype": dtype, "data": base64.b64encode(zlib.compress(a.astype(dtype).tobytes(), 1)).decode("ascii")}


def _unpacked(c: Mapping[str, Any], count: int) -> np.ndarray:
    a = np.frombuffer(zlib.decompress(base64.b64decode(c["data"])), dtype=np.dtype(c["dtype"])).astype(np.int64)
    if a.shape != (count,):
        raise ValueError(f"a stored rank table column of {a.size} values, not {count}")
    return a


def is_stored_table(value: Any) -> bool:
    return isinstance(value, Mapping) and value.get("encoding") == STORED_ENCODING


def as_rank_table(ranks: Any) -> RankTable | None:
    """``ranks`` as a :class:`RankTable` when it is one or a large enough list that can be one."""
    if isinstance(ranks, RankTable):
        return ranks
    if type(ranks) is list and len(ranks) >= COMPACT_MIN_RANKS:
        return RankTable.from_rows(ranks)
    return None


def _entries(result: Mapping[str, Any]) -> Iterator[tuple[dict[str, Any], str]]:
    best = result.get("best")
    if isinstance(best, dict):
        yield best, "ranks"
    for alt in result.get("alternatives") or []:
        if isinstance(alt, dict):
            yield alt, "ranks"


def encode_rank_tables(result: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a plan result for storage: each entry's large rank table (a :class:`RankTable`
    or a list that can be one) as its stored object; everything else shared, unchanged."""
    out = dict(result)
    for key in ("best", "alternatives"):
        v = out.get(key)
        if key == "best" and isinstance(v, dict):
            out[key] = _encode_entry(v)
        elif key == "alternatives" and isinstance(v, list):
            out[key] = [_encode_entry(a) if isinstance(a, dict) else a for a in v]
    return out


def _encode_entry(entry: dict[str, Any]) -> dict[str, Any]:
    table = as_rank_table(entry.get("ranks"))
    return entry if table is None else {**entry, "ranks": table.to_stored()}


def decode_rank_tables(result: Any) -> Any:
    """A stored plan result with each stored rank table as a :class:`RankTable` (in place:
    the result was just decoded from the database)."""
    if not isinstance(result, dict):
        return result
    for entry, key in _entries(result):
        if is_stored_table(entry.get(key)):
            entry[key] = RankTable.from_stored(entry[key])
    return result


def plain_rank_tables(value: Any) -> Any:
    """``value`` (plan JSON) with every :class:`RankTable` as a plain list of row dicts."""
    if isinstance(value, RankTable):
        return value.to_list()
    if type(value) is dict:
        return {k: plain_rank_tables(v) for k, v in value.items()}
    if type(value) is list:
        return [plain_rank_tables(v) for v in value]
    return value


def dumps_with_tables(value: Any) -> bytes:
    """JSON of ``value`` as Starlette's ``JSONResponse`` renders it (compact, UTF-8, no NaN),
    with each :class:`RankTable` where a plan holds one (``value["best"]["ranks"]`` and each
    ``value["alternatives"][i]["ranks"]``) written from its columns (:meth:`RankTable.json_bytes`);
    a table anywhere else is written as its rows."""
    tables: list[RankTable] = []

    def swap_entry(entry: Any) -> Any:
        if type(entry) is dict and isinstance(entry.get("ranks"), RankTable):
            tables.append(entry["ranks"])
            return {**entry, "ranks": _placeholder(len(tables) - 1)}
        return entry

    swapped = value
    if type(value) is dict:
        swapped = dict(value)
        if "best" in swapped:
            swapped["best"] = swap_entry(swapped["best"])
        if type(swapped.get("alternatives")) is list:
            swapped["alternatives"] = [swap_entry(a) for a in swapped["alternatives"]]
    text = _dumps(swapped)
    for i, t in enumerate(tables):
        marker = _json(_placeholder(i)).encode("utf-8")
        if text.count(marker) != 1:  # a value of the plan equal to the marker: render the rows
            return _dumps(value)
        head, _, tail = text.partition(marker)
        text = head + t.json_bytes() + tail
    return text


def _dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":"),
                      default=_rows_of).encode("utf-8")


def _rows_of(value: Any) -> Any:
    """``json.dumps``'s fallback: a rank table as its rows; anything else is not JSON."""
    if isinstance(value, RankTable):
        return value.rows()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_PLACEHOLDER = "\x00rank-table-{}\x00"


def _placeholder(i: int) -> str:
    # NUL is escaped (\u0000) in JSON text: the quoted marker is only ever a string equal to it.
    return _PLACEHOLDER.format(i)
