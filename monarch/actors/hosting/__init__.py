"""A proc hosting actors: its control server (:mod:`.server`), its entry point
(:mod:`.proc`: ``python -m monarch.actors.hosting.proc``), the proc half of log forwarding
(:mod:`.log_forwarding`), the owner tree's failure routing (:mod:`.supervisor`), and the
receiving side of each actor: its life (:mod:`.instance`), its mailbox and runners
(:mod:`.mailbox`, :mod:`.init_thread`), a message's way in with the lost-message check
(:mod:`.delivery`), handling it (:mod:`.dispatch`) and answering (:mod:`.reply`).

Area of :mod:`monarch.actors`: above calls; below procs.
"""
