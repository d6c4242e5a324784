"""The parts of the mutation campaign that ``tools/mutation.py`` runs (docs/tests.md; the command's ``--help``).

- ``modules``: what each module's run mutates, the test files that own it, and the environment of every run.
- ``copies``: the copy of the repository each module runs in (``mutants/<module>/``) and mutmut's command line there.
- ``copy_conftest``: the ``conftest.py`` of such a copy: each mutant's killer and time, and the order of its tests.
- ``verdicts``: a run's results (mutmut's, the rechecks', the equivalent mutants') and its report.
- ``equivalent.tsv``: the mutants that no input can tell from the original, one a line with the reason.
- ``rechecks``: survivors written into the source and tested in fresh processes (plain, or with TorchScript on).
- ``switched``: the tests as they are now against the last run's mutants, switched on as mutmut does, in one process.
- ``cuda``: the mutants only a CUDA device can kill, checked on one.

Nothing here is imported by ``tcnn`` or its tests; mutmut itself runs in subprocesses, so the command answers
``list`` and ``--help`` without it.
"""
