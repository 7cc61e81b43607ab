"""Stop strings found in streamed text in time independent of how many there are (Aho-Corasick).

One automaton per distinct stop list (cached), one `StopScan` per completion (the server's
streams), or `StopAutomaton.earliest` over a window of the text (the engine, whose decoded text may
still change in its last characters). The automaton's state after each character is the longest
end of the text so far that begins some stop string: that is exactly the text a stream must hold
back, and a state that ends a stop string is a match. Torch-free and server-free: the engine and
the server both import it.
"""

from __future__ import annotations

from collections import deque
from functools import lru_cache


class StopAutomaton:
    """Aho-Corasick over a list of stop strings: goto, failure links, and the longest match per state."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.goto: list[dict[str, int]] = [{}]
        self.depth = [0]  # characters from the root: the length of the state's string
        self.fail = [0]
        self.match = [0]  # length of the longest stop string that ends at this state (0: none)
        self.longest = max((len(stop) for stop in stops), default=0)
        for stop in stops:
            state = 0
            for ch in stop:
                nxt = self.goto[state].get(ch)
                if nxt is None:
                    nxt = len(self.goto)
                    self.goto[state][ch] = nxt
                    self.goto.append({})
                    self.depth.append(self.depth[state] + 1)
                    self.fail.append(0)
                    self.match.append(0)
                state = nxt
            self.match[state] = len(stop)
        pending = deque(self.goto[0].values())
        while pending:
            state = pending.popleft()
            for ch, nxt in self.goto[state].items():
                pending.append(nxt)
                back = self.fail[state]
                while back and ch not in self.goto[back]:
                    back = self.fail[back]
                self.fail[nxt] = self.goto[back].get(ch, 0)
                if not self.match[nxt]:
                    self.match[nxt] = self.match[self.fail[nxt]]

    def earliest(self, text: str, start: int = 0) -> int | None:
        """Where the earliest-beginning stop string in `text[start:]` begins (an index into `text`),
        or None: what min(text.find(s, start) for s in stops) gives, in work that does not grow
        with the number of stops."""
        state, best = 0, None
        for i in range(start, len(text)):
            state = self.step(state, text[i])
            length = self.match[state]
            if length:  # keep scanning: a longer stop string ending later may begin earlier
                begin = i + 1 - length
                if best is None or begin < best:
                    best = begin
                if best <= i + 1 - self.depth[state]:  # no stop string still open began before it
                    return best
        return best

    def step(self, state: int, ch: str) -> int:
        goto, fail = self.goto, self.fail
        while state and ch not in goto[state]:
            state = fail[state]
        return goto[state].get(ch, 0)


@lru_cache(maxsize=64)
def automaton(stops: tuple[str, ...]) -> StopAutomaton:
    """The automaton for this stop list (n choices of one request share it)."""
    return StopAutomaton(stops)


class StopScan:
    """Feeds a completion's final text through the automaton, chunk by chunk."""

    def __init__(self, stops: list[str]) -> None:
        self._automaton = automaton(tuple(stops))
        self._state = 0

    def feed(self, text: str) -> tuple[int | None, int]:
        """(where the earliest-beginning stop string completed in this chunk begins, relative to the
        chunk's start: negative when it began in text fed before; None if none), and the length of
        the longest end of all text fed so far that begins some stop string (what to hold back)."""
        auto, state, best = self._automaton, self._state, None
        for i, ch in enumerate(text):
            state = auto.step(state, ch)
            length = auto.match[state]
            if length:  # keep scanning: a longer stop string ending later in the chunk may begin earlier
                start = i + 1 - length
                best = start if best is None else min(best, start)
        self._state = state
        return best, auto.depth[state]
