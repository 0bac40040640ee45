"""A proc hosting actors: its control server (:mod:`.server`), its entry point
(:mod:`.proc`: ``python -m monarch.actors.hosting.proc``), the proc half of log forwarding
(:mod:`.log_forwarding`) and the owner tree's failure routing (:mod:`.supervisor`).

Area of :mod:`monarch.actors`: above calls; below procs.
"""
