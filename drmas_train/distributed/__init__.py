"""Scale-out on Ray: a resource pool of placement-group bundles, one worker group per model (training ranks in one
``torch.distributed`` process group + generation workers), and the backend / updater that plug them into the
single-process trainer's interfaces. See ``docs/architecture.md`` ("Distributed layout").

Nothing here is imported by the single-process path; ``ray`` is imported lazily.
"""

from drmas_train.distributed.cluster import DistributedError, init_ray

__all__ = ["DistributedError", "init_ray"]
