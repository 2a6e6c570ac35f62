"""Task 4, PagedAttention: a block allocator hands out blocks of a few tokens as a request
grows, so each request wastes at most one block (the paper's page). The allocator is in the
script; read in this order:

    task_4_paged_attention.py   the block allocator, the five requests; calls the report, saves
    report.py                   the report and its insight lines
    record.py                   what it saves: each request's blocks, the pool's figures; the
                                summary's row
    figure.py                   each request's blocks against contiguous slots, the pool at its
                                peak
"""
from lessons.task_4.figure import draw_pages
from lessons.task_4.record import PagedKV, summary_row

# what the lab reads back (common/steps.py)
RECORD = PagedKV                 # results/task_4_paged_attention.json
FIGURES = (("", draw_pages),)    # results/task_4_paged_attention.png

