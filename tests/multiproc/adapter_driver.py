"""`scaletrain run ARGS` in a launcher whose torch renamed two privates the launcher patches, as
a future torch may: ``SimpleElasticAgent._remaining_restarts`` (torch's own agent keeps working
under the new name) and ``TailLog._finished_events`` (its ``__init__`` no longer names it;
torch's ``stop`` finds what the real one set)."""

import sys

from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
from torch.distributed.elastic.multiprocessing.tail_log import TailLog

init, tail_init = SimpleElasticAgent.__init__, TailLog.__init__


def __init__(self, *args, **kwargs):  # the renamed torch's: it names no _remaining_restarts
    init(self, *args, **kwargs)


def _get(self):
    return self.restarts_left


def _set(self, value):
    self.restarts_left = value


# torch's own methods, renamed with it: they reach the count under its new name
setattr(SimpleElasticAgent, "_remaining" + "_restarts", property(_get, _set))
SimpleElasticAgent.__init__ = __init__
TailLog.__init__ = lambda self, *args, **kwargs: tail_init(self, *args, **kwargs)

from scaletrain.cli.main import entry  # noqa: E402

sys.argv = ["scaletrain", "run", *sys.argv[1:]]
entry()
