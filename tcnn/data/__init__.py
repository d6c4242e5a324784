"""Data: a model's preprocessing, image folders and timm's dataset readers, the recipe's augmentation, images for the
CLI.

One concept per module, so that what saves and exports a model (``tcnn.save``, ``tcnn.export``: they need the data
config only) does not import the dataset code:

* ``config``: ``data_config``, the model's eval preprocessing (mean, std, crop, interpolation), overridden by a
  recipe in ``recipe_data_config``; what a T-CNN file and an exported file store.
* ``images``: image files for the CLI (``find_images``, a class-balanced ``sample_images``, ``load_images``,
  ``denormalize``).
* ``transforms``: ``build_transforms``, timm's train/eval transforms with the recipe's DeiT augmentation, safe on
  every supported Pillow (``posterize``).
* ``folders``: ``open_dataset``, an ImageFolder split (``DATA/SPLIT/CLASS/IMAGE``) whose unreadable images either stop
  the run with one line naming the file (default) or are skipped and logged once each (``skip_bad_images``).
* ``readers``: ``open_reader_datasets``, ``--data READER/...`` (timm's ``wds``, ``hfds``, ``hfids``, ``tfds``
  readers): streams become ``StreamDataset``, the map-style ``hfds`` a ``ReaderDataset``.
* ``training``: ``open_training_data``, the two splits of a training run and the class count they imply.
"""
