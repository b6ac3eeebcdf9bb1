"""gbmw's hybrid runtime: runs any Plan on torch.distributed (one technique per file).

Only `groups` (pure rank math) exists so far; the runtime itself is being built (see the hybrid-runtime issue).
"""
