"""`scaletrain run ARGS` in a launcher whose torch builds an agent that keeps its restart count
under another name, set in an ``__init__`` of its own (at instance level), as a newer torch may:
the class's code still names ``_remaining_restarts`` (so a probe of its code finds it), torch's
other methods still read it, and the live object has none."""

import sys

import torch.distributed.launcher.api as launcher_api

base = launcher_api.LocalElasticAgent
renamed = "_remaining" + "_restarts"  # spelt apart: the stand-in's code must not name it


class LocalElasticAgent(base):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.restarts_left = vars(self).pop(renamed)


launcher_api.LocalElasticAgent = LocalElasticAgent

from scaletrain.cli.main import entry  # noqa: E402

sys.argv = ["scaletrain", "run", *sys.argv[1:]]
entry()
