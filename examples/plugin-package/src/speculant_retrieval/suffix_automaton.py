"""A suffix automaton over token ids: finds, in time linear in the query, the
longest suffix of a token sequence that occurs in the corpus, and where.

Each state stands for a set of corpus substrings that end at the same set of
positions; ``first_end[state]`` is the index of the last token of their first
occurrence. Building is linear in the corpus size (amortised).
"""

from __future__ import annotations

from collections.abc import Sequence


class SuffixAutomaton:
    def __init__(self, tokens: Sequence[int]) -> None:
        self.tokens = list(tokens)
        self.next: list[dict[int, int]] = [{}]
        self.link: list[int] = [-1]
        self.length: list[int] = [0]
        self.first_end: list[int] = [-1]
        last = 0
        for pos, tok in enumerate(self.tokens):
            last = self._extend(last, tok, pos)

    def _new_state(self, length: int, first_end: int, link: int, nxt: dict[int, int]) -> int:
        self.next.append(nxt)
        self.link.append(link)
        self.length.append(length)
        self.first_end.append(first_end)
        return len(self.next) - 1

    def _extend(self, last: int, tok: int, pos: int) -> int:
        cur = self._new_state(self.length[last] + 1, pos, 0, {})
        p = last
        while p != -1 and tok not in self.next[p]:
            self.next[p][tok] = cur
            p = self.link[p]
        if p != -1:
            q = self.next[p][tok]
            if self.length[p] + 1 == self.length[q]:
                self.link[cur] = q
            else:
                clone = self._new_state(self.length[p] + 1, self.first_end[q], self.link[q], dict(self.next[q]))
                while p != -1 and self.next[p].get(tok) == q:
                    self.next[p][tok] = clone
                    p = self.link[p]
                self.link[q] = clone
                self.link[cur] = clone
        return cur

    def longest_suffix_match(self, query: Sequence[int]) -> tuple[int, int]:
        """``(length, end)``: the longest suffix of ``query`` found in the corpus,
        and the corpus index just past its first occurrence (``(0, 0)`` if none)."""
        state, matched = 0, 0
        for tok in query:
            while state != 0 and tok not in self.next[state]:
                state = self.link[state]
                matched = self.length[state]
            if tok in self.next[state]:
                state = self.next[state][tok]
                matched += 1
        if matched == 0:
            return 0, 0
        return matched, self.first_end[state] + 1
