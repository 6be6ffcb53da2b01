"""Parallel strategies (DDP, ZeRO/FSDP2, HSDP, offload, pipeline), precision, memory estimates."""
