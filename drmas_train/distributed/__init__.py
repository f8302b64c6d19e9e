"""Scale-out on Ray: a resource pool of placement-group bundles, one worker group per model (training ranks in one
``torch.distributed`` process group + generation engines), the data-parallel update on the ranks, and the backend /
updater that plug them into the single-process trainer's interfaces. See ``docs/architecture.md`` ("Distributed
layout").

Floor 8 of drmas_train (over floors 0-7).

Importing this package imports no Ray; every module that needs Ray imports it at its top.
"""
