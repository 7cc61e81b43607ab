"""Token ids to streamed text, holding back what may still change: half a UTF-8 character, or the
start of a stop sequence. A stop sequence ends the text and is not part of it (OpenAI semantics)."""

from __future__ import annotations

from typing import Protocol

REPLACEMENT_CHAR = "\ufffd"


class Decoder(Protocol):
    def decode(self, token_ids: list[int]) -> str: ...


class IncrementalText:
    """Accumulates a completion's token ids and yields the text that is final so far."""

    def __init__(self, tokenizer: Decoder, stop: list[str] | None = None) -> None:
        self._tokenizer = tokenizer
        self._stop = [s for s in (stop or []) if s]
        self.token_ids: list[int] = []
        self.text = ""  # text emitted so far
        self.stopped = False  # a stop sequence was found; the text ends before it

    def add(self, new_token_ids: list[int]) -> str:
        """Append tokens; return the newly final text (possibly empty)."""
        if self.stopped or not new_token_ids:
            return ""
        self.token_ids.extend(new_token_ids)
        full = self._tokenizer.decode(self.token_ids)
        cut = self._find_stop(full)
        if cut is not None:
            self.stopped = True
            return self._emit(full[:cut])
        return self._emit(full[: self._safe_length(full)])

    def finish(self) -> str:
        """The request ended: release anything held back."""
        if self.stopped or not self.token_ids:
            return ""
        full = self._tokenizer.decode(self.token_ids)
        return self._emit(full)

    def _emit(self, final: str) -> str:
        if not final.startswith(self.text):
            # The decoder re-interpreted earlier text (rare with byte-level tokenizers): emit only
            # what extends what the client already has, never retract.
            common = _common_prefix(final, self.text)
            if len(common) < len(self.text):
                return ""
        delta = final[len(self.text) :]
        self.text = final if len(final) > len(self.text) else self.text
        return delta

    def _find_stop(self, full: str) -> int | None:
        # Only search where a new match can begin: the held-back tail plus the new text.
        start = max(0, len(self.text) - max((len(s) for s in self._stop), default=0))
        hits = [i for s in self._stop if (i := full.find(s, start)) >= 0]
        return min(hits) if hits else None

    def _safe_length(self, full: str) -> int:
        end = len(full)
        while end > len(self.text) and full[end - 1] == REPLACEMENT_CHAR:
            end -= 1
        hold = 0
        for stop in self._stop:
            for k in range(min(len(stop) - 1, end), hold, -1):
                if full[end - k : end] == stop[:k]:
                    hold = k
                    break
        return max(len(self.text), end - hold)


def _common_prefix(a: str, b: str) -> str:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return a[:n]
