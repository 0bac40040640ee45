"""Two actors in two processes hit a ball to each other.

    python examples/ping_pong.py

Our own telling of the ping-pong example from Monarch's documentation: an
actor reference travels as an endpoint argument, and an actor calls another
actor from inside its endpoint (a sync endpoint may block on ``.get()``).
Each actor handles one message at a time, so a serve waits for each return
before the next hit: an actor that called back into a caller blocked on it
would wait forever, which is why the rallies are served one side at a time.
"""

from monarch.actor import Actor, current_rank, endpoint, this_host


class Player(Actor):
    def __init__(self, name: str) -> None:
        self.name = name
        self.partner = None
        self.returned = 0

    @endpoint
    def meet(self, partner) -> None:
        self.partner = partner

    @endpoint
    def serve(self, hits: int) -> list[str]:
        """Hit the ball to the partner ``hits`` times; collect what comes back."""
        return [self.partner.hit.call_one(self.name, i).get() for i in range(hits)]

    @endpoint
    def hit(self, sender: str, i: int) -> str:
        self.returned += 1
        return f"{self.name} returns {sender}'s ball {i} (return #{self.returned})"

    @endpoint
    def where(self) -> str:
        return f"{self.name} plays at {current_rank()!r}"


if __name__ == "__main__":
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    ping = procs.slice(gpus=0).spawn("ping", Player, "ping")
    pong = procs.slice(gpus=1).spawn("pong", Player, "pong")
    ping.meet.call_one(pong).get()
    pong.meet.call_one(ping).get()
    print(ping.where.call_one().get())
    print(pong.where.call_one().get())
    for line in ping.serve.call_one(2).get() + pong.serve.call_one(2).get():
        print(line)
    procs.stop().get()
