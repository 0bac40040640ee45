"""The ``monarch`` command (``broker``, ``host``, ``ps``, ``tail``, ``demo``).

Layer: the top floor; it may import anything below. Subcommands import their
work when they run, so ``monarch --help`` stays fast.
"""
