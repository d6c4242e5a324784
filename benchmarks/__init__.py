"""Benchmarks of tcnn: the T-CNN against its CNN, our GPSA against the obvious implementation, and the paper.

Run ``python benchmarks/run.py --quick`` (see docs/benchmarks.md). Modules:

* ``reference_gpsa``: GPSA written the straightforward way (the baseline our layer has to beat);
* ``sdpa_gpsa``: our layer with a ``scaled_dot_product_attention`` content path (the alternative design);
* ``measure``: interleaved timing, peak memory (CPU and CUDA), FLOPs;
* ``suites``: what is measured (whole models, single layers, FLOPs/params, conversion time) and the goals;
* ``paper``: the figures of the T-CNN paper (arXiv:2106.05795, Tables 1 and 2), the paper's, not ours;
* ``report``: machine description, JSON results and the markdown table.
"""
