"""The job's Python environment: the one running scaletrain on a login node (``detect``), and
one built on a cluster's own PyTorch for jobs (``create``, ``scaletrain env create``)."""
