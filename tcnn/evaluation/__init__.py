"""Evaluation: scores on clean and corrupted data, their tables and figures, and the model card that reports them.

* ``suites``: the ImageNet, -C, -A and -R suites: folder layouts, class lists, label spaces, the resolution policy.
* ``scoring``: ``evaluate``, the loop over a suite's images, and each suite's results (top-1, top-5, mCE).
* ``tables``: plain-text and markdown tables, and ``tcnn eval``'s report as a table, notes and files.
* ``plots``: training curves and accuracy by corruption (the heads' own figures are ``tcnn.analysis``').
* ``model_card``: the model card and ``config.json`` facts of a published T-CNN (recipe, scores, GPSA layers).
"""
