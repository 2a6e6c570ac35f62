"""The lab as a whole: its run end to end, the summary and the report page over every step, the
faults a learner meets, the code's layout, model resolution, and the tools and benchmarks around
the lessons."""
