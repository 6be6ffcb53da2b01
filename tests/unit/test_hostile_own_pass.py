"""What a fresh hostile pass (kinds the earlier ones did not try) found, each refused in one line or
read as "not known": the Monitor's other step figures (tokens=10**400 raised OverflowError in the
writer, data_wait_s=NaN and an extra field past a float were taken), rank_print's ranks (a
negative one and range(10**6) were taken; range(10**18) never returned), setup()'s strategy
options (bucket_cap_mb inf/NaN, static_graph="no" taken, min_params="x" a TypeError), a dataset
whose len() is 2.5, a sampler file whose header interval is 10**400, an OMP_NUM_THREADS that is
no count (said to be 1 thread), lint of --gres/--time/--mem values sbatch refuses, port of such a
script (1 node), and an Env whose extra facts are not text."""

from __future__ import annotations

import pytest
import torch
from helpers import run_cli

import scaletrain
from scaletrain.errors import StrategyError, UsageError
from scaletrain.launch.threads import thread_budget
from scaletrain.lint.engine import lint_text
from scaletrain.observe.nodesampler import Reading, read_samples

BIG = 10**400


@pytest.mark.parametrize("more, says", [
    ({"tokens": BIG}, "Monitor.step: tokens must be a count"), ({"tokens": -1}, "Monitor.step: tokens must be a count"),
    ({"data_wait_s": float("nan")}, "Monitor.step: data_wait_s must be a finite number"),
    ({"data_wait_s": -1.0}, "Monitor.step: data_wait_s must be a finite number"),
    ({"my_metric": BIG}, "Monitor.step: my_metric = 1000"),
])
def test_the_monitors_other_step_figures_are_checked_before_anything_is_recorded(tmp_path, more, says):
    mon = scaletrain.Monitor(tmp_path / "run", console=False, device_sampler=None)
    with pytest.raises(UsageError) as info:
        mon.step(samples=4, **more)
    assert info.value.message.startswith(says) and "\n" not in info.value.message
    mon.step(samples=4, tokens=128, data_wait_s=0.01, my_metric=float("nan"))   # NaN: a field of the program's
    assert mon.close()["steps"] == 1


@pytest.mark.parametrize("ranks", [range(-1, 3), [0, -2], range(10**6), [True], "0"])
def test_rank_print_checks_its_ranks(ranks):
    with pytest.raises(UsageError, match="^rank_print\\(\\): ranks must be 'all' or a list of whole numbers"):
        scaletrain.rank_print("x", ranks=ranks)


@pytest.mark.parametrize("option, value", [("bucket_cap_mb", float("inf")), ("bucket_cap_mb", float("nan")),
                                           ("bucket_cap_mb", "x"), ("static_graph", "no"), ("min_params", "x"),
                                           ("find_unused_parameters", 1)])
def test_setups_strategy_options_speak_the_vocabulary(option, value):
    with pytest.raises(StrategyError) as info:
        scaletrain.setup(torch.nn.Linear(2, 2), strategy="ddp", env=scaletrain.Env(), **{option: value})
    assert info.value.message.startswith(f"setup(): {option} must be ") and "\n" not in info.value.message


def test_a_dataset_whose_len_is_not_a_whole_number_is_one_line():
    class Half:
        def __len__(self):
            return 2.5

        def __getitem__(self, i):
            return i

    with pytest.raises(UsageError, match=r"the dataset's len\(\) must be a whole number from 0 \(TypeError"):
        scaletrain.loader(Half(), batch_size=1, rank=0, world_size=1, num_workers=0)


def test_a_sampler_header_out_of_range_is_read_as_not_known(tmp_path):
    path = tmp_path / "gpus-n1.jsonl"
    path.write_text('{"type": "sampler", "host": "n1", "interval_s": 1' + "0" * 400 + '}\n'
                    '{"t": 5.0, "devices": {"0": {"util_pct": 1e400, "mem_gb": 3.0}}}\n'
                    '{"t": 6.0, "devices": {"0": {"util_pct": 50.0, "mem_gb": 3.0}}}\n')
    readings = [r for r in read_samples(path) if isinstance(r, Reading)]
    assert [r.t for r in readings] == [6.0] and readings[0].interval_s == 10.0   # the default interval


@pytest.mark.parametrize("value", ["1e400", "0", "auto", "٣"])
def test_an_omp_num_threads_that_is_no_count_is_said_to_be_none(value):
    budget = thread_budget(2, {"OMP_NUM_THREADS": value})
    assert budget.user_set and budget.per_worker == 0 and "is not a thread count: OpenMP ignores it" in budget.source
    assert thread_budget(2, {"OMP_NUM_THREADS": "3"}).per_worker == 3


HEAD = "#!/bin/bash\n#SBATCH --account=p\n"


@pytest.mark.parametrize("line", ["--gres=gpu:a100:1e400", "--gres=gpu:-1", "--time=99999999999999999999-00:00:00",
                                  "--mem=1e400G"])
def test_lint_reports_gres_time_and_memory_sbatch_refuses(line):
    found = [f for f in lint_text(HEAD + f"#SBATCH {line}\n\nsrun python t.py\n").findings if f.rule == "sbatch-value"]
    assert len(found) == 1 and found[0].line == 3


@pytest.mark.parametrize("line", ["--gres=gpu:a100", "--gres=gpu:a100:4(S:0)", "--gres=gpu:4,nvme:100", "--gres=gpu"])
def test_lint_takes_the_gres_forms_sbatch_reads(line):
    assert not [f for f in lint_text(HEAD + f"#SBATCH {line}\n#SBATCH --time=1:00:00\n\nsrun python t.py\n").findings
                if f.rule == "sbatch-value"]


def test_port_refuses_a_script_sbatch_would_refuse(capsys, tmp_path):
    old = tmp_path / "old.sh"
    old.write_text("#!/bin/bash\n#SBATCH --nodes=1e400\n#SBATCH --account=p\n#SBATCH --time=1:00:00\nsrun python t.py\n")
    code, out, err = run_cli(capsys, "port", str(old), "--cluster", "roihu")
    assert code == 2 and out == "" and f"{old}:2: --nodes=1e400: not a whole number" in err, err


def test_an_env_whose_extra_facts_are_not_text_is_refused():
    with pytest.raises(UsageError, match="^Env: extra must be a mapping of str to str"):
        scaletrain.Env(extra={"cpus_per_task": 8})
