"""Where work runs (docs/distributed.md): in this process (the default), or across the workers of a Dask
cluster: an embedded one on this machine (`--workers N`, `--gpus`), an existing scheduler
(`--cluster tcp://HOST:PORT`, `mini-kv worker`) or Slurm (`--cluster slurm`, dask-jobqueue).
`cluster` starts or joins the cluster; `batch` runs the pipeline's items there and stores their attempts
here; `manifest` reads `mini-kv batch`'s file. Dask is imported only when a cluster is asked for."""
