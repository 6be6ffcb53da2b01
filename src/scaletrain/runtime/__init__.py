"""Per-process runtime: detect the launcher, start torch.distributed, pick device and CPUs."""
