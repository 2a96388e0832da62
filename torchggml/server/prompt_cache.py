"""The host-memory prompt cache (llama-server's --cache-ram): prompts whose cells a slot gave up
(the slot was taken for another prompt, or its cells were needed by a running request) are kept
here with a copy of their KV cells, least recently used first out, at most `limit` bytes in all.
A request whose prompt shares a longer prefix with an entry than with any idle slot's cells has
that prefix put back into its slot instead of evaluated again.

Entries hold token lists and KVCache.save_seq copies (SeqCells). As in llama-server, an entry
whose tokens begin another's is dropped in favour of the longer one, and one larger than the
whole limit is not kept. Used by the engine thread only.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass


def common_prefix(a, b) -> int:
    """The number of leading tokens a and b share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass(eq=False)
class Entry:
    tokens: list[int]
    cells: object  # SeqCells

    @property
    def nbytes(self) -> int:
        return self.cells.nbytes() + 4 * len(self.tokens)


class PromptCache:
    def __init__(self, limit_bytes: int):
        if limit_bytes < 0:
            raise ValueError(f"prompt cache limit {limit_bytes} must not be negative")
        self.limit = int(limit_bytes)
        self.entries: collections.OrderedDict[int, Entry] = collections.OrderedDict()  # oldest first
        self.stored = self.evicted = self.hits = self.restored_tokens = 0  # counters for /metrics

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries.values())

    @property
    def n_tokens(self) -> int:
        return sum(len(e.tokens) for e in self.entries.values())

    def clear(self) -> None:
        """Drop every entry (their cells were computed with other LoRA scales)."""
        self.evicted += len(self.entries)
        self.entries.clear()

    def wants(self, tokens: list[int]) -> bool:
        """Whether `tokens` would be stored: the cache is on, and no entry holds them already."""
        return self.limit > 0 and bool(tokens) and not any(
            common_prefix(e.tokens, tokens) == len(tokens) for e in self.entries.values())

    def add(self, tokens: list[int], cells) -> bool:
        """Keep `tokens` and their cells (most recent); False when they are larger than the limit."""
        entry = Entry(list(tokens), cells)
        if not self.wants(tokens) or entry.nbytes > self.limit:
            return False
        for key, e in list(self.entries.items()):  # entries it extends are no longer needed
            if common_prefix(e.tokens, tokens) == len(e.tokens):
                del self.entries[key]
        while self.entries and self.nbytes + entry.nbytes > self.limit:
            self.entries.popitem(last=False)
            self.evicted += 1
        self.entries[id(entry)] = entry
        self.stored += 1
        return True

    def best(self, prompt: list[int]) -> tuple[Entry | None, int]:
        """The entry sharing the longest prefix with `prompt`, and that length (None, 0: none)."""
        best, n = None, 0
        for e in self.entries.values():
            k = common_prefix(e.tokens, prompt)
            if k > n:
                best, n = e, k
        return best, n

    def take(self, entry: Entry, n: int) -> None:
        """`n` of the entry's tokens go back into a slot: a whole entry leaves the cache (the slot
        holds it now), a part of one stays, as the most recently used."""
        self.hits += 1
        self.restored_tokens += n
        if n >= len(entry.tokens):
            self.entries.pop(id(entry), None)
        else:
            self.entries.move_to_end(id(entry))

    def clear(self) -> None:
        self.entries.clear()
