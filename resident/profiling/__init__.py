"""Profile windows, read the same way whichever tool recorded them: a trace becomes a Timeline
(timeline.py; torch_trace.py for torch.profiler's Chrome traces, nsys.py for Nsight Systems'
CSV reports), a Timeline a ProfileSummary per step kind, two summaries a kernel diff
(summary.py). Pure Python: the API process and the gate read traces without torch."""
