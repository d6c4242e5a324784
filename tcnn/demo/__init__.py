"""``tcnn demo``: the whole method end to end, offline, in miniature (see ``tcnn.demo.runner``)."""
