"""The PyTorch backend: torchrun, DeviceMesh, DTensor tensor parallel, pipelining, FSDP2, DCP.

This package's `__init__` and `launcher` import no torch: `gplan launch --dry-run` works without it.
"""

ENGINE = "torch"
"""The engine profile this backend runs (gplan.engines.torch_worker): the accounting its plans are priced by."""
