"""SOL-ExecBench problems through mini_kv's pipeline.

Stages, one module each: `definition`, `workload`, `solution` (strict loaders), `languages`
(what can run here), `build` (staging + the content-addressed compiler), `inputs` and `check`
(worker side: input generation, the correctness rule), `evaluate` (worker side: one workload),
`traces` (the upstream trace layout), `run` (the parent's orchestration and the attempt), `table`.
"""
