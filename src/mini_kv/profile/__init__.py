"""Nsight Compute profiles of one candidate on one fixed case, and their comparison.

`capture` runs ncu around `target` (a small process that builds the case's inputs with the
card's factory and seed and calls the candidate), re-imports the report as CSV, and `metrics`
checks that exactly one row belongs to the candidate's kernel and that every required metric
is there. `store` keeps each profile as a hash-listed directory under artifacts/profiles/;
`compare` refuses profiles that are not comparable and lays out the metric deltas; `ab` times
the two candidates in one process, because a profiler's replay durations are not latencies.
"""
