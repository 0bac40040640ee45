"""The job of the TracingForwarder tests: an actor that logs through Monarch's handler.

``python -c "...log_actors import main; main()" TAG`` (imported, not run as
``__main__``: the procs import this module, and with it its handler) spawns two actors; each logs one
WARNING line carrying TAG and its rank, the client logs one too, and the last
line printed is a JSON object with the actors' ids.
"""

from __future__ import annotations

import json
import logging
import sys

from monarch._src.actor.telemetry import TracingForwarder
from monarch.actor import Actor, context, endpoint, shutdown_context, this_host

logger = logging.getLogger("tests.telemetry.forwarded")
logger.addHandler(TracingForwarder())
logger.setLevel(logging.INFO)
logger.propagate = False


class Talker(Actor):
    @endpoint
    def say(self, tag: str) -> str:
        me = context().actor_instance
        logger.warning("%s from rank %d", tag, me.rank.rank)
        return str(me.actor_id)


def main() -> int:
    tag = sys.argv[1]
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = procs.spawn("talkers", Talker)
    ids = sorted(mesh.say.call(tag).get(timeout=60).values())
    logger.info("%s from the client", tag)
    procs.stop().get(timeout=60)
    shutdown_context().get(timeout=60)
    print(json.dumps({"actor_ids": ids}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
