"""The server's pure parts without a process: streamed text with stop strings and half characters,
the idempotency store's TTL and bound, admission arithmetic, byte sizes."""

from __future__ import annotations

import pytest

from kvpilot.engine.server.http.errors import APIError
from kvpilot.engine.server.runtime.admission import Admission
from kvpilot.engine.server.runtime.capacity_plan import parse_bytes
from kvpilot.engine.server.runtime.idempotency import IdempotencyStore, body_fingerprint
from kvpilot.engine.server.runtime.result_log import ResultLog, event_bytes
from kvpilot.engine.server.wire.detokenizer import IncrementalText

pytestmark = pytest.mark.unit


class ByteDecoder:
    """Token id = one UTF-8 byte, as a byte-level BPE's base vocabulary."""

    def decode(self, token_ids: list[int]) -> str:
        return bytes(token_ids).decode("utf-8", errors="replace")


def _ids(text: str) -> list[int]:
    return list(text.encode())


def _stream(text: str, stop: list[str]) -> tuple[list[str], IncrementalText]:
    inc = IncrementalText(ByteDecoder(), stop)
    deltas = [inc.add([b]) for b in _ids(text)]
    deltas.append(inc.finish())
    return deltas, inc


def test_text_streams_byte_by_byte_and_reassembles() -> None:
    deltas, inc = _stream("plain text", [])
    assert "".join(deltas) == "plain text" == inc.text
    assert deltas[:3] == ["p", "l", "a"]


def test_half_a_utf8_character_is_held_back() -> None:
    deltas, _ = _stream("é€", [])
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == "é€"
    assert deltas[0] == "" and deltas[1] == "é"  # 2-byte é appears only when complete


def test_stop_string_ends_the_text_and_is_never_emitted() -> None:
    deltas, inc = _stream("hello STOP world", ["STOP"])
    assert "".join(deltas) == "hello "
    assert inc.stopped
    assert not any("S" in d for d in deltas)  # "S", "ST", "STO" were held back, then dropped


def test_a_stop_prefix_that_does_not_complete_is_released() -> None:
    deltas, inc = _stream("a STep STOP", ["STOP"])
    assert "".join(deltas) == "a STep "
    assert not inc.stopped or inc.text == "a STep "


def test_earliest_of_several_stop_strings_wins() -> None:
    deltas, _ = _stream("one, two. three", [".", ","])
    assert "".join(deltas) == "one"


def test_held_back_tail_is_released_at_the_end() -> None:
    deltas, inc = _stream("ends with ST", ["STOP"])
    assert deltas[-1] == "ST" and inc.text == "ends with ST" and not inc.stopped


def test_idempotency_same_body_joins_other_body_is_422() -> None:
    store = IdempotencyStore(ttl_seconds=10, max_keys=10)
    log = ResultLog()
    fp = body_fingerprint("/v1/completions", {"prompt": "x", "max_tokens": 3})
    assert store.lookup("k", fp) is None
    store.remember("k", fp, log)
    assert store.lookup("k", body_fingerprint("/v1/completions", {"max_tokens": 3, "prompt": "x"})) is log
    with pytest.raises(APIError) as err:
        store.lookup("k", body_fingerprint("/v1/chat/completions", {"prompt": "x", "max_tokens": 3}))
    assert err.value.status == 422 and "different request body" in err.value.message


def test_idempotency_keys_expire_after_the_ttl() -> None:
    now = [0.0]
    store = IdempotencyStore(ttl_seconds=5, max_keys=10, clock=lambda: now[0])
    store.remember("k", "fp", ResultLog())
    now[0] = 4.9
    assert store.lookup("k", "fp") is not None
    now[0] = 5.1
    assert store.lookup("k", "fp") is None and len(store) == 0


def test_idempotency_store_is_bounded_oldest_first() -> None:
    store = IdempotencyStore(ttl_seconds=100, max_keys=3)
    for key in "abcd":
        store.remember(key, key, ResultLog())
    assert len(store) == 3
    assert store.lookup("a", "a") is None
    assert all(store.lookup(k, k) is not None for k in "bcd")


def test_failed_results_are_forgotten_so_a_retry_runs_again() -> None:
    store = IdempotencyStore()
    ok, failed = ResultLog(), ResultLog()
    store.remember("ok", "fp", ok)
    store.remember("bad", "fp", failed)
    ok.append({"id": "x"})
    ok.finish()
    failed.fail(APIError(500, "boom"))
    assert store.lookup("ok", "fp") is ok
    assert store.lookup("bad", "fp") is None


def _admission(**kw: int) -> tuple[Admission, list[str]]:
    rejected: list[str] = []
    args = {"max_model_len": 100, "max_num_seqs": 2, "max_queue": 1, **kw}
    return Admission(record_rejection=rejected.append, **args), rejected


def test_admission_max_tokens() -> None:
    adm, rejected = _admission()
    assert adm.max_tokens_for(10, 90, None) == 90
    assert adm.max_tokens_for(10, None, None) == 90  # chat: the room left
    assert adm.max_tokens_for(10, None, 16) == 16  # completions: OpenAI's default
    assert adm.max_tokens_for(95, None, 16) == 5
    with pytest.raises(APIError) as err:
        adm.max_tokens_for(10, 91, None)
    assert err.value.status == 400
    assert (
        "10 tokens" in err.value.message and "91" in err.value.message and "101 tokens" in err.value.message
    )
    assert "length of 100 tokens" in err.value.message and "at most 90" in err.value.message
    with pytest.raises(APIError):
        adm.max_tokens_for(100, None, None)
    assert rejected == ["too_long", "too_long"]


def test_admission_queue_limit_is_running_plus_queue() -> None:
    adm, rejected = _admission()
    for _ in range(3):
        adm.acquire()
    assert adm.waiting == 1
    with pytest.raises(APIError) as err:
        adm.acquire()
    assert err.value.status == 429 and err.value.headers == {"Retry-After": "1"}
    assert rejected == ["queue_full"]
    adm.release()
    adm.acquire()
    assert adm.in_flight == 3


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1048576", 2**20),
        ("256MiB", 256 * 2**20),
        ("2GiB", 2 * 2**30),
        ("1.5G", 1_500_000_000),
        ("64mb", 64 * 10**6),
    ],
)
def test_parse_bytes(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "MiB", "12 parsecs", "-"])
def test_parse_bytes_rejects_nonsense(text: str) -> None:
    with pytest.raises(ValueError, match="is not a byte size"):
        parse_bytes(text)


def test_idempotency_store_is_bounded_in_bytes_as_streams_grow() -> None:
    # Finding 4: 10,000 keys of 2,048-token streams held ~3.7 GB; the bound is now in bytes.
    event = "data: " + "x" * 1000 + "\n\n"
    one = event_bytes(event)
    store = IdempotencyStore(ttl_seconds=100, max_keys=1000, max_bytes=25 * one)
    logs = {key: ResultLog() for key in "abc"}
    for key, log in logs.items():
        store.remember(key, key, log)
        for _ in range(10):  # each stream grows after its key was remembered
            log.append(event)
    assert store.nbytes == 30 * one > store.max_bytes
    store.remember("d", "d", ResultLog())  # the sum is checked again: the oldest goes
    assert store.lookup("a", "a") is None and store.nbytes == 20 * one
    assert all(store.lookup(k, k) is not None for k in "bcd")
    with pytest.raises(ValueError, match="max bytes >= 1"):
        IdempotencyStore(max_bytes=0)
