"""What each Slurm example of the centre guides asks for, as data: the golden tests run without the guides.

One entry per (guide, block, cluster) case of ``test_plan_golden.CASES``: the job shape (nodes, tasks per
node, GPUs per node, CPUs per task, memory, partition family, time, launch form) that the guide's script
asks for, read by ``test_plan_golden.job_shape``, plus the ``--time`` it gives. Facts in our own words, not
the guides' text. ``test_stored_facts_match_the_guides`` re-reads them from the guides when they are present
(../shared/seeds), so the data cannot drift from the documents.

Guides: 000 / 001 = CSC "Multi-GPU and multi-node machine learning" (current / earlier revision),
003 = Alliance "PyTorch" page, 004 = JSC course "Parallelize Training".
"""

from __future__ import annotations

# The order of each row's values.
COLUMNS = ("nodes", "tasks_per_node", "gpus_per_node", "cpus_per_task", "mem", "partition_family",
           "time_s", "srun", "kind", "nproc", "multi_node_rdzv", "node_rank", "time")

FACTS: dict[tuple[str, int, str], tuple[object, ...]] = {
    ('000', 0, 'puhti'): (1, 1, 2, 20, '160G', 'gpu', 3600, True, 'python', None, False, False, '1:00:00'),
    ('000', 1, 'mahti'): (1, 1, 2, 64, None, 'gpusmall', 3600, True, 'python', None, False, False, '1:00:00'),
    ('000', 2, 'lumi'): (1, 1, 2, 14, '120G', 'lumi-g', 3600, True, 'python', None, False, False, '1:00:00'),
    ('000', 3, 'puhti'): (1, 4, 4, 10, '320G', 'gpu', 3600, True, 'python', None, False, False, '1:00:00'),
    ('000', 4, 'mahti'): (1, 4, 4, 32, None, 'gpumedium', 3600, True, 'python', None, False, False, '1:00:00'),
    ('000', 5, 'lumi'): (1, 8, 8, 7, '480G', 'lumi-g', 3600, True, 'python', None, False, False, '1:00:00'),
    ('000', 6, 'puhti'): (2, 1, 4, 40, '320G', 'gpu', 3600, True, 'python', None, False, False, '1:00:00'),
    ('000', 7, 'mahti'): (2, 1, 4, 128, None, 'gpumedium', 3600, True, 'python', None, False, False, '1:00:00'),
    ('000', 8, 'lumi'): (2, 1, 8, 56, '480G', 'lumi-g', 3600, True, 'python', None, False, False, '1:00:00'),
    ('000', 9, 'puhti'): (2, 4, 4, 10, '320G', 'gpu', 3600, True, 'python', None, False, False, '1:00:00'),
    ('000', 10, 'mahti'): (2, 4, 4, 32, None, 'gpumedium', 3600, True, 'python', None, False, False, '1:00:00'),
    ('000', 11, 'lumi'): (2, 8, 8, 7, '480G', 'lumi-g', 3600, True, 'python', None, False, False, '1:00:00'),
    ('000', 12, 'puhti'): (1, 1, 4, 40, '320G', 'gpu', 3600, True, 'torchrun', 4, False, False, '1:00:00'),
    ('000', 13, 'mahti'): (1, 1, 4, 128, None, 'gpumedium', 3600, True, 'torchrun', 4, False, False, '1:00:00'),
    ('000', 14, 'lumi'): (1, 1, 8, 56, '480G', 'lumi-g', 3600, True, 'torchrun', 8, False, False, '1:00:00'),
    ('000', 15, 'puhti'): (2, 1, 4, 40, '320G', 'gpu', 3600, True, 'torchrun', 4, True, False, '1:00:00'),
    ('000', 16, 'mahti'): (2, 1, 4, 128, None, 'gpumedium', 3600, True, 'torchrun', 4, True, False, '1:00:00'),
    ('000', 17, 'lumi'): (2, 1, 8, 56, '480G', 'lumi-g', 3600, True, 'torchrun', 8, True, False, '1:00:00'),
    ('000', 18, 'puhti'): (1, 4, 4, 10, '320G', 'gpu', 3600, True, 'python', None, False, False, '1:00:00'),
    ('000', 19, 'mahti'): (1, 4, 4, 32, None, 'gpumedium', 3600, True, 'python', None, False, False, '1:00:00'),
    ('000', 20, 'lumi'): (1, 8, 8, 7, '480G', 'lumi-g', 3600, True, 'python', None, False, False, '1:00:00'),
    ('000', 21, 'puhti'): (2, 4, 4, 10, '320G', 'gpu', 3600, True, 'python', None, False, False, '1:00:00'),
    ('000', 22, 'mahti'): (2, 4, 4, 32, None, 'gpumedium', 3600, True, 'python', None, False, False, '1:00:00'),
    ('000', 23, 'lumi'): (2, 8, 8, 7, '480G', 'lumi-g', 3600, True, 'python', None, False, False, '1:00:00'),
    ('000', 24, 'puhti'): (1, 1, 4, 40, '320G', 'gpu', 3600, True, 'accelerate', 4, False, False, '1:00:00'),
    ('000', 25, 'mahti'): (1, 1, 4, 128, None, 'gpumedium', 3600, True, 'accelerate', 4, False, False, '1:00:00'),
    ('000', 26, 'lumi'): (1, 1, 8, 56, '480G', 'lumi-g', 3600, True, 'accelerate', 8, False, False, '1:00:00'),
    ('000', 27, 'puhti'): (2, 1, 4, 40, '320G', 'gpu', 3600, True, 'accelerate', None, True, True, '1:00:00'),
    ('000', 28, 'mahti'): (2, 1, 4, 128, None, 'gpumedium', 3600, True, 'accelerate', None, True, True, '1:00:00'),
    ('000', 29, 'lumi'): (2, 1, 8, 56, '480G', 'lumi-g', 3600, True, 'accelerate', None, True, True, '1:00:00'),
    ('000', 30, 'puhti'): (1, 1, 4, 40, '320G', 'gpu', 3600, True, 'deepspeed', None, False, False, '1:00:00'),
    ('000', 31, 'mahti'): (1, 1, 4, 128, None, 'gpumedium', 3600, True, 'deepspeed', None, False, False, '1:00:00'),
    ('001', 0, 'puhti'): (1, 1, 2, 20, '64G', 'gpu', 3600, True, 'python', None, False, False, '1:00:00'),
    ('001', 1, 'mahti'): (1, 1, 2, 10, None, 'gpusmall', 3600, True, 'python', None, False, False, '1:00:00'),
    ('001', 2, 'lumi'): (1, 1, 2, 16, None, 'lumi-g', 3600, True, 'python', None, False, False, '1:00:00'),
    ('001', 3, 'puhti'): (1, 4, 4, 10, '0', 'gpu', 3600, True, 'python', None, False, False, '1:00:00'),
    ('001', 4, 'mahti'): (1, 4, 4, 10, None, 'gpumedium', 3600, True, 'python', None, False, False, '1:00:00'),
    ('001', 5, 'lumi'): (1, 8, 8, 8, None, 'lumi-g', 3600, True, 'python', None, False, False, '1:00:00'),
    ('001', 6, 'puhti'): (2, 1, 4, 40, '0', 'gpu', 3600, True, 'python', None, False, False, '1:00:00'),
    ('001', 7, 'mahti'): (2, 1, 4, 40, None, 'gpumedium', 3600, True, 'python', None, False, False, '1:00:00'),
    ('001', 8, 'lumi'): (2, 1, 8, 64, None, 'lumi-g', 3600, True, 'python', None, False, False, '1:00:00'),
    ('001', 9, 'puhti'): (2, 4, 4, 10, '64G', 'gpu', 3600, True, 'python', None, False, False, '1:00:00'),
    ('001', 10, 'mahti'): (2, 4, 4, 10, None, 'gpumedium', 3600, True, 'python', None, False, False, '1:00:00'),
    ('001', 11, 'lumi'): (2, 8, 8, 8, None, 'lumi-g', 3600, True, 'python', None, False, False, '1:00:00'),
    ('001', 12, 'puhti'): (1, 1, 4, 40, '0', 'gpu', 3600, True, 'torchrun', 4, False, False, '1:00:00'),
    ('001', 13, 'mahti'): (1, 1, 4, 40, None, 'gpumedium', 3600, True, 'torchrun', 4, False, False, '1:00:00'),
    ('001', 14, 'lumi'): (1, 1, 8, 128, None, 'lumi-g', 3600, True, 'torchrun', 8, False, False, '1:00:00'),
    ('001', 15, 'puhti'): (2, 1, 4, 40, '0', 'gpu', 3600, True, 'torchrun', 4, True, False, '1:00:00'),
    ('001', 16, 'mahti'): (2, 1, 4, 40, None, 'gpumedium', 3600, True, 'torchrun', 4, True, False, '1:00:00'),
    ('001', 17, 'lumi'): (2, 1, 8, 128, None, 'lumi-g', 3600, True, 'torchrun', 4, True, False, '1:00:00'),
    ('001', 18, 'puhti'): (1, 1, 4, 40, '0', 'gpu', 3600, True, 'deepspeed', None, False, False, '1:00:00'),
    ('001', 19, 'mahti'): (1, 1, 4, 40, None, 'gpumedium', 3600, True, 'deepspeed', None, False, False, '1:00:00'),
    ('001', 20, 'puhti'): (2, 4, 4, 10, '0', 'gpu', 3600, True, 'python', None, False, False, '1:00:00'),
    ('001', 21, 'mahti'): (2, 4, 4, 10, None, 'gpumedium', 3600, True, 'python', None, False, False, '1:00:00'),
    ('003', 0, 'cedar'): (1, 1, 1, 6, '32000M', None, 10800, False, 'python', None, False, False, '0-03:00'),
    ('003', 0, 'graham'): (1, 1, 1, 6, '32000M', None, 10800, False, 'python', None, False, False, '0-03:00'),
    ('003', 2, 'narval'): (1, 1, 1, 1, '8G', None, 300, False, 'python', None, False, False, '0:05:00'),
    ('003', 4, 'narval'): (1, 2, 2, 1, '8G', None, 10800, True, 'python', None, False, False, '0-03:00'),
    ('003', 5, 'narval'): (1, 2, 2, 1, '8G', None, 10800, True, 'python', None, False, False, '0-03:00'),
    ('003', 6, 'beluga'): (1, 2, 2, 1, '8G', None, 10800, True, 'python', None, False, False, '0-03:00'),
    ('003', 9, 'narval'): (1, 2, 2, 1, '32G', None, 1200, True, 'python', None, False, False, '0-00:20'),
    ('003', 10, 'narval'): (1, 2, 2, 1, '32G', None, 1200, True, 'python', None, False, False, '0-00:20'),
    ('003', 11, 'narval'): (1, 2, 2, 1, '32G', None, 1200, True, 'python', None, False, False, '0-00:20'),
    ('004', 0, 'juwels-booster'): (1, 1, 1, 96, '0', 'booster', 21600, True, 'python', None, False, False, '06:00:00'),
    ('004', 1, 'juwels-booster'): (1, 4, 4, 24, '0', 'booster', 7200, True, 'python', None, False, False, '02:00:00'),
    ('004', 2, 'juwels-booster'): (16, 4, 4, 24, '0', 'booster', 900, True, 'python', None, False, False, '00:15:00'),
    ('003', 1, 'narval'): (1, 1, 0, 1, '8G', None, 300, False, 'python', None, False, False, '0:05:00'),
    ('003', 3, 'narval'): (1, 8, 1, 1, '8G', None, 300, True, 'python', None, False, False, '0:05:00'),
    ('003', 7, 'narval'): (1, 1, 2, 1, '8G', None, 600, False, 'python', None, False, False, '0:10:00'),
    ('003', 8, 'narval'): (2, 2, 4, 1, '16G', None, 600, True, 'python', None, False, False, '0:10:00'),
}


def shape(key: tuple[str, int, str]) -> dict[str, object]:
    """The stored job shape of a case, by column name."""
    return dict(zip(COLUMNS, FACTS[key]))
