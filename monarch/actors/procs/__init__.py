"""Starting and owning procs.

Launchers: the ``Launcher`` protocol and the one place that starts and reaps a
proc's process (:mod:`.launcher`, implemented by the host agents' launcher too),
the thread that starts children (:mod:`.launcher_thread`), one file a launcher
(:mod:`.local_launcher`, :mod:`.command_launcher`, and :mod:`.zygote_client`,
the client of the fork template :mod:`.zygote`). Proc meshes: the owner's state
machine (:mod:`.proc_mesh_state`), the user API (:mod:`.proc_mesh`), the
reference and its wire codec (:mod:`.proc_mesh_ref`); host meshes
(:mod:`.host_mesh`), singleton controllers (:mod:`.controllers`) and the owner
half of log collection (:mod:`.log_collection`).

Area of :mod:`monarch.actors`: the top one, below only the client bootstrap
(:mod:`monarch.actors.client`) and the compatibility names (:mod:`monarch.actors.compat`).
"""
