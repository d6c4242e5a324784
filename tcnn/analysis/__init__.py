"""What the GPSA heads of a T-CNN learned (T-CNN, arXiv:2106.05795, section 4), read from the model alone.

* ``heads``: per-head gates, spans and centres, attention maps for a query pixel, nonlocality (``tcnn inspect``,
  the training dashboards, the demo's analysis).
* ``figures``: the gate/span charts and attention-map grids of those numbers, and the figure file helpers.

It sits below training and evaluation: both draw on it, and it needs only the GPSA layers and the conversion.
"""
