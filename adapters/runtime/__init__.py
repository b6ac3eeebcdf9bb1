"""gbmw's hybrid runtime: runs any Plan on torch.distributed (one technique per file).

So far: `groups` (rank math and the process-group pool) and `launch` (device, backend and
torch.distributed start-up); the rest of the runtime is being built (see the hybrid-runtime issue).
"""
