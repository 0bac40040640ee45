"""The actor protocol on the wire: message kinds and bodies (:mod:`.messages`), requests to
many procs (:mod:`.rpc`), flow control (:mod:`.flow`), and what finds and reports messages a
dead broker node lost (:mod:`.lost_replies`, :mod:`.lost_sends`, :mod:`.loss_recovery`).

Area of :mod:`monarch.actors`: above meshes; below calls, hosting and procs.
"""
