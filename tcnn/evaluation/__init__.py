"""Evaluation: scores on clean and corrupted data, the attention analysis of the paper's figures, and plots.

* ``suites``: the ImageNet, -C, -A and -R suites: folder layouts, class lists, label spaces, the resolution policy.
* ``scoring``: ``evaluate``, the loop over a suite's images, and each suite's results (top-1, top-5, mCE).
* ``tables``: plain-text and markdown tables, and ``tcnn eval``'s report as a table, notes and files.
* ``analysis``: gates, spans, attention maps and nonlocality of a T-CNN's GPSA layers (``tcnn inspect``).
* ``plots``: the figures (gate/span charts, attention maps, training curves, accuracy by corruption).
"""
