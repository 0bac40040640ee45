"""Starting and owning procs: launchers (:mod:`.launcher`, with the ``Launcher`` protocol the
host agents' launcher implements too), the fork template (:mod:`.zygote`), proc and host
meshes (:mod:`.proc_mesh`, :mod:`.host_mesh`), singleton controllers (:mod:`.controllers`)
and the owner half of log collection (:mod:`.log_collection`).

Area of :mod:`monarch.actors`: the top one, below only the client bootstrap
(:mod:`monarch.actors.client`) and the compatibility names (:mod:`monarch.actors.compat`).
"""
