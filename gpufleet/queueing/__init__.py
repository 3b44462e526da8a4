"""Team queues in Kueue's shapes: which workload gets quota, from which flavor, and whom
it may preempt (``admission``, pure), and the API server's side of it (``serverside``)."""
