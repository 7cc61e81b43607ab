"""BlockTableRows: the host mirror of block tables stays equal to the sequences' lists under appends,
replaced lists (eviction, preemption), releases, and growth past its initial rows and width."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kvpilot.engine.worker.inputs import BlockTableRows

pytestmark = pytest.mark.unit


def mirrored(rows: BlockTableRows, request_id: str, table: list[int]) -> list[int]:
    row = rows.row(request_id, table)
    values = rows.table[row].tolist()
    assert all(v == -1 for v in values[len(table) :]), f"stale entries after the table: {values[len(table):]}"
    return values[: len(table)]


def test_appends_are_written_incrementally() -> None:
    rows = BlockTableRows(rows=2, width=4)
    table = [7, 3]
    assert mirrored(rows, "a", table) == [7, 3]
    table += [9]
    assert mirrored(rows, "a", table) == [7, 3, 9]


def test_a_replaced_shorter_list_clears_the_old_tail() -> None:
    rows = BlockTableRows(rows=2, width=8)
    table = [1, 2, 3, 4, 5]
    mirrored(rows, "a", table)
    assert mirrored(rows, "a", [1, 4]) == [1, 4]  # eviction keeps sinks and window in a new list
    assert mirrored(rows, "a", []) == []  # preemption: deallocate assigns []
    assert mirrored(rows, "a", [8, 9, 10]) == [8, 9, 10]


def test_released_rows_are_reused_clean() -> None:
    rows = BlockTableRows(rows=1, width=4)
    mirrored(rows, "a", [5, 6, 7])
    rows.release("a")
    assert mirrored(rows, "b", [1]) == [1]
    rows.release("never-seen")  # no error


def test_grows_in_rows_and_width() -> None:
    rows = BlockTableRows(rows=1, width=4)
    tables = {f"r{i}": list(range(i * 100, i * 100 + 3 + 70 * i)) for i in range(5)}
    for rid, table in tables.items():
        assert mirrored(rows, rid, table) == table
    for rid, table in tables.items():  # earlier rows survive the growth
        assert rows.table[rows.row(rid, table), : len(table)].tolist() == table
    assert rows.table.shape[1] % 64 == 0


def test_random_operations_match_the_lists() -> None:
    rng = random.Random(0)
    rows = BlockTableRows(rows=2, width=4)
    tables: dict[str, list[int]] = {}
    for _ in range(2000):
        rid = f"r{rng.randrange(12)}"
        op = rng.random()
        if op < 0.1:
            rows.release(rid)
            tables.pop(rid, None)
            continue
        table = tables.setdefault(rid, [])
        if op < 0.2 and table:  # replaced by a list without some entries
            table = tables[rid] = [b for b in table if rng.random() < 0.5]
        else:
            table.extend(rng.randrange(1000) for _ in range(rng.choice((0, 1, 1, 3, 40))))
        assert mirrored(rows, rid, table) == table
    used = {rows.row(rid, t) for rid, t in tables.items()}
    assert len(used) == len(tables), "two live requests share a row"
    assert rows.table.dtype == np.int32
