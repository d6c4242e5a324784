"""Sub-commands of the ``tcnn`` CLI: each module has ``add_arguments(parser)`` and ``run(args) -> int``."""
