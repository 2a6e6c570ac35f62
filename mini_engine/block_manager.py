"""Pages of the KV cache, handed to sequences as they grow (task 4's page allocator for real), and
shared between sequences whose tokens start the same (automatic prefix caching, as vLLM does).

A sequence of n tokens holds cdiv(n, page_size) pages, listed in its page table; its token at
position p lives in slot page_table[p // page_size] * page_size + p % page_size of the pool.

Prefix caching (vLLM's block_pool.py / kv_cache_utils.py, nano-vllm's names):
- a full page gets a hash of its parent page's hash and its own token ids, so equal hashes mean
  equal prefixes, not just equal pages (sha256, vLLM's default);
- every Block counts the page tables it is in (ref_count); a page is free when that is zero;
- at admission a sequence takes the longest run of cached full pages that matches its tokens and
  computes only the rest. Its last token is always computed (its logits pick the next token), so
  at most (n - 1) // page_size pages can hit: a prompt of exactly k pages hits k - 1 at most;
- a page is registered in the step that computes its last token, when that step is scheduled
  (vLLM registers blocks when it schedules them): a request admitted later in the same step then
  hits it, and reads its K/V in the same forward, after the first request's rows have written it
  (each layer writes every row's K/V before any row attends). A page of a later chunk is not
  registered before its chunk's step (a request that hit it then would read K/V not yet
  written): admission registers the pages full within the cached prefix and the first chunk, the
  scheduler the rest as their chunks and decodes are scheduled;
- a sequence that finishes or is preempted drops its references, tail pages first; a page whose
  count reaches zero keeps its hash and joins the free queue at the back, in LRU order. It is
  evicted (its hash forgotten) only when the queue hands it out again;
- only full pages are ever shared, and a sequence writes K/V only into pages past its full
  shared ones (its own), so a shared page is never written and no copy-on-write is needed.
  (Static batching's padding rows recompute a token they already hold: the engine points their
  write at a scratch page, not at a page that may be shared.)

With caching off, the same pool and free queue, without hashes: task 4's allocator.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

from mini_engine.sequence import Sequence


def cdiv(a: int, b: int) -> int:
    """Pages of b tokens that a tokens need: ceil(a / b), in integers."""
    return -(-a // b)


class OutOfPages(Exception):
    """Every page is in use (the scheduler checks first, so this is a bug when it is raised)."""


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: bytes | None = None          # set while the page is registered in the cache
    token_ids: tuple = ()              # the tokens it holds when registered (checked on a hit)


def page_hash(parent: bytes | None, token_ids) -> bytes:
    """sha256 of the parent page's hash and this page's token ids: the prefix's fingerprint."""
    data = (parent or b"") + b"".join(t.to_bytes(4, "little") for t in token_ids)
    return hashlib.sha256(data).digest()


class BlockManager:
    def __init__(self, num_pages: int, page_size: int, enable_prefix_caching: bool = False):
        self.num_pages = num_pages
        self.page_size = page_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_pages)]
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_pages))
        self.hash_to_block_id: dict[bytes, int] = {}
        self.num_query_tokens = 0      # tokens of admitted sequences looked up in the cache
        self.num_hit_tokens = 0        # of which found there (vLLM's prefix_cache_queries/hits)
        self.num_evictions = 0

    @property
    def num_free(self) -> int:
        return len(self.free_queue)

    @property
    def num_used(self) -> int:
        return self.num_pages - len(self.free_queue)

    # --- growing a running sequence ------------------------------------------------------------
    def num_pages_needed(self, seq: Sequence, num_tokens: int) -> int:
        """New pages seq needs to hold num_tokens tokens."""
        return max(0, cdiv(num_tokens, self.page_size) - len(seq.page_table))

    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        return self.num_pages_needed(seq, num_tokens) <= self.num_free

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Grow seq's page table to hold num_tokens tokens; a page only when the last is full."""
        for _ in range(self.num_pages_needed(seq, num_tokens)):
            seq.page_table.append(self._take_free())

    def _take_free(self) -> int:
        """The least recently freed page; if it still holds a cached prefix, that is evicted."""
        if not self.free_queue:
            raise OutOfPages(f"all {self.num_pages} pages are in use")
        block = self.blocks[self.free_queue.popitem(last=False)[0]]
        if block.hash is not None:
            if self.hash_to_block_id.get(block.hash) == block.block_id:
                del self.hash_to_block_id[block.hash]
            block.hash, block.token_ids = None, ()
            self.num_evictions += 1
        block.ref_count = 1
        return block.block_id

    # --- admitting a sequence ------------------------------------------------------------------
    def cached_prefix(self, seq: Sequence) -> list[int]:
        """Block ids of the longest run of seq's full pages found in the cache, leaving its last
        token to compute (at most (n - 1) // page_size pages)."""
        if not self.enable_prefix_caching:
            return []
        hits = []
        for i in range((seq.num_tokens - 1) // self.page_size):
            block_id = self.hash_to_block_id.get(self._seq_page_hash(seq, i))
            if block_id is None or self.blocks[block_id].token_ids != self._page_tokens(seq, i):
                break
            hits.append(block_id)
        return hits

    def can_admit(self, seq: Sequence, num_tokens: int | None = None) -> bool:
        """Room for seq's first num_tokens tokens (all of them if None): its cache hits cost a
        free page only if nobody holds them."""
        hits = self.cached_prefix(seq)
        num_tokens = seq.num_tokens if num_tokens is None else num_tokens
        num_new = cdiv(num_tokens, self.page_size) - len(hits)
        num_revived = sum(self.blocks[b].ref_count == 0 for b in hits)
        return num_new + num_revived <= self.num_free

    def admit(self, seq: Sequence, num_tokens: int | None = None) -> None:
        """Give seq its page table for its first num_tokens tokens (all of them if None: the
        cached prefix and the first chunk): the cached prefix shared, new pages for the rest. Its
        K/V is then in the pool up to the prefix (seq.num_cached); the pages full within
        num_tokens are registered (this step computes them)."""
        hits = self.cached_prefix(seq)
        for block_id in hits:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_queue[block_id]        # a cached free page comes back to life
            block.ref_count += 1
        seq.page_table = list(hits)
        seq.num_cached = len(hits) * self.page_size
        seq.num_cached_at_admission = seq.num_cached
        self.num_query_tokens += seq.num_tokens
        self.num_hit_tokens += seq.num_cached
        num_tokens = seq.num_tokens if num_tokens is None else num_tokens
        self.allocate(seq, num_tokens)
        self.register_full_pages(seq, num_tokens)

    # --- registering and freeing ---------------------------------------------------------------
    def register_full_pages(self, seq: Sequence, num_tokens: int) -> None:
        """Put seq's pages that are full within its first num_tokens tokens into the cache."""
        if not self.enable_prefix_caching:
            return
        for i in range(seq.num_registered, num_tokens // self.page_size):
            block = self.blocks[seq.page_table[i]]
            h = self._seq_page_hash(seq, i)
            if block.hash is None and h not in self.hash_to_block_id:
                block.hash, block.token_ids = h, self._page_tokens(seq, i)
                self.hash_to_block_id[h] = block.block_id
            # else: a hit (already registered), or the same tokens computed twice in another
            # page: the first one stays the cached copy, this one is freed as usual
        seq.num_registered = max(seq.num_registered, num_tokens // self.page_size)

    def roll_back(self, seq: Sequence, num_tokens: int) -> None:
        """seq keeps only the pages of its first num_tokens tokens (speculative decoding: the
        pages that only rejected guesses were written into). Those pages are its own, never
        registered (no guess is), so they go to the FRONT of the free queue: handing them out
        first evicts no cached prefix."""
        while len(seq.page_table) > cdiv(num_tokens, self.page_size):
            block = self.blocks[seq.page_table.pop()]
            assert block.ref_count == 1 and block.hash is None, \
                f"page {block.block_id} of rejected guesses is shared or cached"
            block.ref_count = 0
            self.free_queue[block.block_id] = None
            self.free_queue.move_to_end(block.block_id, last=False)

    def free(self, seq: Sequence) -> None:
        """seq drops its references, tail pages first (so they are evicted first); a page nobody
        holds goes to the back of the free queue, its cached prefix kept."""
        for block_id in reversed(seq.page_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0, f"page {block_id} freed more often than it was taken"
            if block.ref_count == 0:
                self.free_queue[block_id] = None
        seq.page_table = []
        seq.num_cached = 0
        seq.num_registered = 0

    # --- hashes --------------------------------------------------------------------------------
    def _page_tokens(self, seq: Sequence, i: int) -> tuple:
        start, end = i * self.page_size, (i + 1) * self.page_size
        if end <= len(seq.prompt_ids):       # a prompt's page: no copy of the whole token list
            return tuple(seq.prompt_ids[start:end])
        return tuple(seq.token_ids[start:end])

    def _seq_page_hash(self, seq: Sequence, i: int) -> bytes:
        """Hash of seq's i-th full page, chained from its first page (kept on the sequence: the
        tokens of a full page never change)."""
        while len(seq.page_hashes) <= i:
            n = len(seq.page_hashes)
            seq.page_hashes.append(page_hash(seq.page_hashes[-1] if n else None,
                                             self._page_tokens(seq, n)))
        return seq.page_hashes[i]
