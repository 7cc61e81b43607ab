"""Issue 33 item 2: stop strings are found by one Aho-Corasick scan whose work per character does
not grow with their number, with the same text out as the per-stop search it replaced (the server's
streams, StopScan) and the same cut as the engine's per-stop find (StopAutomaton.earliest)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpilot.engine.server.wire.detokenizer import IncrementalText
from kvpilot.engine.stop_matcher import StopAutomaton, StopScan

pytestmark = pytest.mark.unit


class CharDecoder:
    """Token id = one character's code point."""

    def decode(self, token_ids: list[int]) -> str:
        return "".join(map(chr, token_ids))


def reference(text: str, stops: list[str], cuts: list[int]) -> tuple[str, bool]:
    """The per-stop search the scan replaced: fed in chunks, the earliest-beginning stop string
    completed in a chunk cuts the text where it begins."""
    seen, bounds = "", sorted({c for c in cuts if 0 < c < len(text)} | {len(text)})
    start = 0
    for end in bounds:
        seen += text[start:end]
        hits = [i for s in stops if (i := seen.find(s)) >= 0]
        if hits:
            return seen[: min(hits)], True
        start = end
    return text, False


def scanned(text: str, stops: list[str], cuts: list[int]) -> tuple[str, bool, list[str]]:
    inc = IncrementalText(CharDecoder(), stops)
    deltas, bounds, start = [], sorted({c for c in cuts if 0 < c < len(text)} | {len(text)}), 0
    for end in bounds:
        deltas.append(inc.add([ord(c) for c in text[start:end]]))
        start = end
        if inc.stopped:
            break
    deltas.append(inc.finish())
    return inc.text, inc.stopped, deltas


@settings(max_examples=400, deadline=None)
@given(
    text=st.text(alphabet="abc", max_size=40),
    stops=st.lists(st.text(alphabet="abc", min_size=1, max_size=5), min_size=1, max_size=6),
    cuts=st.lists(st.integers(0, 40), max_size=10),
)
def test_the_scan_cuts_where_the_per_stop_search_cut(text: str, stops: list[str], cuts: list[int]) -> None:
    expected, stopped = reference(text, stops, cuts)
    got, got_stopped, deltas = scanned(text, stops, cuts)
    assert (got, got_stopped) == (expected, stopped)
    assert "".join(deltas) == got
    for k in range(1, len(deltas)):  # nothing emitted was ever the start of a stop string still to come
        emitted = "".join(deltas[:k])
        assert not any(s in emitted for s in stops)


def test_held_back_text_is_the_longest_end_that_begins_a_stop() -> None:
    scan = StopScan(["abcd", "bce", "x"])
    assert scan.feed("zab") == (None, 2)  # "ab" may begin "abcd"
    assert scan.feed("c") == (None, 3)  # "abc"
    assert scan.feed("e")[0] == -2  # "bce" began two characters before this chunk


def test_work_per_character_does_not_grow_with_the_number_of_stops() -> None:
    few = StopAutomaton(tuple(f"stop-{i}" for i in range(2)))
    many = StopAutomaton(tuple(f"stop-{i}" for i in range(128)))
    text = "stop-" * 2000 + "x" * 10_000  # every character walks the trie; no stop ever completes

    def steps(automaton: StopAutomaton) -> int:
        calls, state = 0, 0
        for ch in text:
            while state and ch not in automaton.goto[state]:
                state = automaton.fail[state]
                calls += 1
            state = automaton.goto[state].get(ch, 0)
            calls += 1
        return calls

    assert steps(many) <= steps(few) * 1.01  # the per-stop search did 64 times the work here
    assert StopScan([f"stop-{i}" for i in range(128)]).feed(text) == (None, 0)


@settings(max_examples=400, deadline=None)
@given(
    text=st.text(alphabet="abc", max_size=40),
    stops=st.lists(st.text(alphabet="abc", min_size=1, max_size=5), min_size=1, max_size=6),
    start=st.integers(0, 45),
)
def test_earliest_is_the_per_stop_find_the_engine_did(text: str, stops: list[str], start: int) -> None:
    hits = [i for i in (text.find(s, start) for s in stops) if i >= 0]
    assert StopAutomaton(tuple(stops)).earliest(text, start) == (min(hits) if hits else None)

