"""Token ids to streamed text in O(1) tokens of work per new token.

A completion is decoded through a short window of its last tokens (the prefix/read-offset idea of
vLLM): the window starts a few tokens before the text not yet emitted, so a tokenizer that
needs left context (a Metaspace leading space, a byte sequence split over tokens) sees it, and the
window slides forward once it grows past `MAX_WINDOW` tokens. Each `add` decodes at most
`MAX_WINDOW + len(new)` tokens and one `CONTEXT`-token window, whatever the completion's length.

What is held back, and only that:
- the last character when it is U+FFFD: it may be the start of a UTF-8 character whose other bytes
  come in the next tokens. The next token settles it: a completed character replaces it, anything
  else releases it as U+FFFD (an invalid byte sequence is never withheld longer than one token);
- the end of the text while it could be the start of a stop string (OpenAI semantics: a stop
  string ends the text and is not part of it). Stop strings are found by one Aho-Corasick scan
  (kvpilot/engine/stop_matcher.py): the work per character does not grow with their number.
"""

from __future__ import annotations

from typing import Protocol

from kvpilot.engine.stop_matcher import StopScan

REPLACEMENT_CHAR = "\ufffd"
# Tokens of left context kept when the window slides. UTF-8 characters have at most 4 bytes and
# every byte-level token carries at least one, so a character held back lies within the window.
CONTEXT = 4
MAX_WINDOW = 3 * CONTEXT  # slide once the window holds this many tokens


class Decoder(Protocol):
    def decode(self, token_ids: list[int]) -> str: ...


class DecodeWork:
    """Process-wide counters of the detokeniser's work (the stats feed reports them)."""

    def __init__(self) -> None:
        self.decoded_tokens_total = 0  # token ids passed to Decoder.decode
        self.output_tokens_total = 0  # token ids added to completions

    def snapshot(self) -> dict[str, int]:
        return {"decoded_tokens_total": self.decoded_tokens_total, "output_tokens_total": self.output_tokens_total}


WORK = DecodeWork()


class IncrementalText:
    """Accumulates a completion's token ids and yields the text that is final so far."""

    def __init__(self, tokenizer: Decoder, stop: list[str] | None = None, work: DecodeWork = WORK) -> None:
        self._tokenizer = tokenizer
        self._stop = [s for s in (stop or []) if s]
        self._scan = StopScan(self._stop) if self._stop else None
        self._work = work
        self.token_ids: list[int] = []
        self._window_start = 0  # first token id of the decode window
        self._window_done = 0  # characters of the window's decode already final
        self._pending = ""  # final text held back because it may start a stop string
        self._pieces: list[str] = []  # text emitted so far, in pieces (joining each time is O(n))
        self.decoded_tokens = 0  # token ids this completion passed to decode (the work done)
        self.stopped = False  # a stop sequence was found; the text ends before it

    @property
    def text(self) -> str:
        """Text emitted so far."""
        return "".join(self._pieces)

    def add(self, new_token_ids: list[int]) -> str:
        """Append tokens; return the newly final text (possibly empty)."""
        if self.stopped or not new_token_ids:
            return ""
        self.token_ids.extend(new_token_ids)
        self._work.output_tokens_total += len(new_token_ids)
        return self._release(self._advance(final=False), final=False)

    def finish(self) -> str:
        """The request ended: release anything held back."""
        if self.stopped or not self.token_ids:
            return ""
        return self._release(self._advance(final=True), final=True)

    # ---- tokens -> final text ----
    def _decode(self, ids: list[int]) -> str:
        self.decoded_tokens += len(ids)
        self._work.decoded_tokens_total += len(ids)
        return self._tokenizer.decode(ids)

    def _advance(self, final: bool) -> str:
        window = self._decode(self.token_ids[self._window_start :])
        end = len(window)
        if not final and end > self._window_done and window.endswith(REPLACEMENT_CHAR):
            end -= 1  # maybe half a character: the next token decides
        new = window[self._window_done : end] if end > self._window_done else ""
        self._window_done = max(self._window_done, end)
        held = len(window) - self._window_done
        if len(self.token_ids) - self._window_start > MAX_WINDOW:
            self._window_start = len(self.token_ids) - CONTEXT
            self._window_done = len(self._decode(self.token_ids[self._window_start :])) - held
        return new

    # ---- final text -> emitted text (stop strings) ----
    def _release(self, new: str, final: bool) -> str:
        if self._scan is None:
            return self._emit(new)
        # Emitted text never begins a stop string (all that might is held in _pending), so a stop
        # found now begins in _pending or in the new text.
        text = self._pending + new
        start, partial = self._scan.feed(new)
        if start is not None:
            self.stopped = True
            self._pending = ""
            return self._emit(text[: max(0, len(text) - len(new) + start)])
        hold = 0 if final else min(partial, len(text))
        self._pending = text[len(text) - hold :] if hold else ""
        return self._emit(text[: len(text) - hold])

    def _emit(self, delta: str) -> str:
        if delta:
            self._pieces.append(delta)
        return delta
