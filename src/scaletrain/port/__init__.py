"""Port an existing batch script to another cluster (``scaletrain port``): read it, plan it again."""
