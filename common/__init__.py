"""Shared pieces of the vLLM lab: one room per concern.

settings  - the source's CPU engine settings, the 128 MiB KV budget, the dtype policy
model     - which model runs (flag / LAB_MODEL / hub / packaged offline model), remembered
cli       - argument parsing that fails with one clear line and exit code 2
kv        - KV-cache arithmetic and the page allocator of tasks 3-4
engine    - the vLLM engine and the HuggingFace baseline, measured the same way
report    - the boxed report every script prints
results   - results/<script>.json, what each script measured
figures   - the pictures drawn from the saved results (one registry: FIGURES)
html_report - results/report.html, every step's report and figures on one page
"""
