"""Task 4, PagedAttention: a page allocator hands out pages of a few tokens as a request grows,
so each request wastes at most one page. The allocator is in the script; read in this order:

    task_4_paged_attention.py   the page allocator, the five requests, the report
    record.py                   what it saves: each request's pages, the pool's figures
    figure.py                   each request's pages against contiguous slots, the pool at its peak
"""
