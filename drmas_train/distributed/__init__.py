"""Scale-out of drmas on Ray: resource pool, worker groups per model, sharded checkpoints."""
