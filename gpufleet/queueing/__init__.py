"""Team queues in Kueue's shapes: which workload gets quota, from which flavor, and whom
it may preempt (``admission``, pure; controllers/kueue/ applies it). The API server's side
of queues (creating queued jobs suspended) is an admission plugin,
gpufleet/apiserver/admission/queues.py."""
