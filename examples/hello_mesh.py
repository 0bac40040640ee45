"""Four trainer actors in four processes, on a broker the client starts itself.

    python examples/hello_mesh.py

The actor class lives in this script's ``__main__``; it travels to the procs
by value. No broker needs starting: with MONARCH_NATS_URL unset the client
runs an embedded nats-server and stops it at exit.
"""

from monarch.actor import Actor, endpoint, this_host


class Trainer(Actor):
    def __init__(self, lr: float):
        self.lr = lr

    @endpoint
    def train(self, step: int) -> float:
        return self.lr * step


if __name__ == "__main__":
    procs = this_host().spawn_procs(per_host={"gpus": 4})
    trainers = procs.spawn("trainers", Trainer, lr=0.1)
    print(trainers.train.call(step=3).get())  # a ValueMesh of 4 results
    print(trainers.slice(gpus=2).train.call_one(step=1).get())
    procs.stop().get()
