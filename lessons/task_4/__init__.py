"""Task 4, PagedAttention: a page allocator hands out pages of a few tokens as a request grows,
so each request wastes at most one page. The allocator is in the script; read in this order:

    task_4_paged_attention.py   the page allocator, the five requests, the report
    record.py                   what it saves: each request's pages, the pool's figures; the
                                summary's row
    figure.py                   each request's pages against contiguous slots, the pool at its peak
"""
from lessons.task_4.figure import draw_pages
from lessons.task_4.record import PagedKV, summary_row

# what the lab reads back (common/steps.py)
RECORD = PagedKV                 # results/task_4_paged_attention.json
FIGURES = (("", draw_pages),)    # results/task_4_paged_attention.png

