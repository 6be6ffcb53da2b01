"""The names of the files in a run folder and a checkpoint folder.

The run folder is what ``submit`` makes (:mod:`scaletrain.slurm.submit`) and the after-submit
verbs read (:mod:`scaletrain.jobs.runfolder`); the training program's Monitor and Checkpointer
write their files into the folders it chooses, which the verbs find there. A name is declared
here once and imported by the writer and every reader (a unit test holds it); what a file holds
and how it is read back is its writer's module's business, not this one's. A leaf module.
"""

from __future__ import annotations

RUNS_DIR = "runs"                  # where run folders go by default, relative to the caller's folder
JOB_SCRIPT = "job.sh"              # the batch script, written whole before sbatch
JOB_ID_FILE = "job_id"             # the id sbatch gave, written once sbatch answered
JOB_LOG = "%x-%j.out"              # the job's output (sbatch's pattern), in the run folder when submitted
METRICS_FILE = "metrics.jsonl"     # the Monitor's records, a line per event
SUMMARY_FILE = "summary.json"      # the Monitor's summary at close
TENSORBOARD_DIR = "tensorboard"    # the Monitor's TensorBoard events
GPU_SAMPLES_PREFIX = "gpus-"       # the node sampler's gpus-<host>.jsonl (plan --sample-gpus)
STOP_RECORD = "stop.json"          # in the Checkpointer's folder: why and at which step it stopped
STEP_DIR_PREFIX = "step-"          # a committed checkpoint's folder, step-00001200 (checkpoint/layout.py)
COMMIT_MARKER = "COMMIT.json"      # in each step-N folder: the checkpoint is complete
SCALING_REPORT = "scaling.json"    # `bench scaling --out`'s report, which `plan --explain` reads too
