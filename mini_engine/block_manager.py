"""Pages of the KV cache, handed to sequences as they grow: task 4's page allocator for real.

A sequence of n tokens holds cdiv(n, page_size) pages, listed in its page table; its token at
position p lives in slot page_table[p // page_size] * page_size + p % page_size of the pool.
"""
from __future__ import annotations

from common.kv import PageAllocator, cdiv
from mini_engine.sequence import Sequence


class BlockManager:
    def __init__(self, num_pages: int, page_size: int):
        self.allocator = PageAllocator(num_pages, page_size)
        self.page_size = page_size
        self.num_pages = num_pages

    @property
    def num_free(self) -> int:
        return self.allocator.num_free

    @property
    def num_used(self) -> int:
        return self.num_pages - self.allocator.num_free

    def num_pages_needed(self, seq: Sequence, num_tokens: int) -> int:
        """New pages seq needs to hold num_tokens tokens."""
        return max(0, cdiv(num_tokens, self.page_size) - len(seq.page_table))

    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        return self.num_pages_needed(seq, num_tokens) <= self.num_free

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Grow seq's page table to hold num_tokens tokens; a page only when the last is full."""
        for _ in range(self.num_pages_needed(seq, num_tokens)):
            seq.page_table.append(self.allocator.allocate())

    def free(self, seq: Sequence) -> None:
        """Give every page back; what was cached is gone (a preempted seq is recomputed)."""
        self.allocator.free(seq.page_table)
        seq.page_table = []
        seq.num_cached = 0
