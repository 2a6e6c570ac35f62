"""Shared pieces of the vLLM lab: one room per concern, one line each. Only what two or more
scripts use lives here; a lesson's own code (task 4's page allocator, task 8's monitor, each
lesson's record, figure and summary row, the summary's roofline) lives in its script or in its
package under lessons/.

settings     - the source's settings, the CPU environment for vLLM, the dtype policy, the machine
shape        - the model's shape from config.json (ModelShape) and the one dtype map
model        - which model runs (flag / LAB_MODEL / hub / packaged offline model), remembered
cli          - argument parsing that fails with one clear line and exit code 2; cli.run(main)
kv           - KV-cache arithmetic, tasks 3-4's requests and their IN BYTES section, capacity in
               whole blocks
engine       - the vLLM engine and the HuggingFace baseline, measured the same way (tasks 1, 2,
               9, 10)
server       - the lab's vLLM OpenAI server: start, reuse, restart, stop (values in, no printing)
load         - the load generator: concurrent streamed requests, TTFT/TPOT/latency per level
metrics      - vLLM's Prometheus /metrics, parsed; a sampler of running/waiting during a load
poller       - a background thread that calls a function every few seconds
memory       - peak memory (PSS) of a process, its children and the lab's server
measure      - the one way of timing: passes in turns, the median and its spread, the best pass
               of a ceiling or a kernel, a long task's progress clock
machine      - the machine's figures, measured once a run (results/machine.json): a decode
               step's cost, the bandwidth and matmul ceilings, the model's kernel floor (the
               summary and tasks 9, 13)
texts        - real text the machine already has, and chat prompts, for the long-prompt tasks
               (11, 12, 14)
report       - the boxed report every script prints (printing only)
results      - results/<script>.json: the run header, typed records, one save and one load
steps        - the one list of the lab's steps (make lab, the summary, the report page), each
               read from its lesson package: RECORD, summary_row, FIGURES; their saved results
               and section-10 rows; the summary, named the same way
figures      - the shared drawing helpers; drawing a result's figures into PNGs
html_report  - results/report.html: the section-10 table first, the figures, every report folded
"""
