"""A training stage as a job: how it is started, who owns its folder, what it reports.

``launch`` (one process or one-host ``msrun``; also the script msrun runs on every worker), ``launcher`` (multi-node
``msrun`` argv and environment, ``python -m pipeline.train.jobs.launcher``), ``slurm`` (one ``sbatch`` job, one
``srun`` task per rank), ``cpu_dispatch`` (a CPU job's MindSpore launches on the calling thread), ``lease`` (job id,
stage-folder lock, heartbeat, cancel and stall), ``fenced`` (a job's files published between two lease fences) and
``metrics`` (metric loggers, the status file, MFU). None of them imports MindSpore at module level.
"""
