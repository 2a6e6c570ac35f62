"""Task 15, the front door: mini_engine behind an OpenAI-compatible server
(mini_engine/server/), beside vLLM's server and `transformers serve --continuous-batching`,
under the same client and the same load, and each against its own engine offline. Read in this
order:

    task_15_serve_your_engine.py   sets up and measures, one server at a time, then prints
    servers.py                     the three servers: their commands, started and stopped
    offline.py                     each server's engine with no server in front, in a fresh
                                   process: the same requests
    record.py                      ThreeServers, the record it saves, the summary's row
    report.py                      the printing and the KEY INSIGHT lines
    figure.py                      served against offline, then the largest level as
                                   timelines, a panel a server
"""
from lessons.task_15.figure import draw_servers
from lessons.task_15.record import ThreeServers, summary_row

OWN_PARTS = ("servers", "offline")      # besides the roles (tests/test_layout.py)

# what the lab reads back (common/steps.py)
RECORD = ThreeServers                   # results/task_15_serve_your_engine.json
FIGURES = (("", draw_servers),)         # results/task_15_serve_your_engine.png
