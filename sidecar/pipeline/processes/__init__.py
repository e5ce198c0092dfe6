"""Encoder processes: the pool the daemon keeps (`pool`), one process as the daemon sees it
(`handle`), the process itself (`main`, run as `python -m sidecar.pipeline.processes.main`),
the route that sends a job to one (`route`), and a process's ready encoder (`ready`)."""
