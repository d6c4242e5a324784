"""Data: a model's preprocessing, image folders and timm's dataset readers, augmentation safe on every Pillow, images
for the CLI. Nothing here knows a recipe: a training run's data is ``tcnn.train.data``.

One concept per module, so that what saves and exports a model (``tcnn.save``, ``tcnn.export``: they need the data
config only) does not import the dataset code:

* ``config``: ``data_config``, the model's eval preprocessing (mean, std, crop, interpolation); what a T-CNN file
  and an exported file store.
* ``images``: image files for the CLI (``find_images``, a class-balanced ``sample_images``, ``load_images``,
  ``denormalize``).
* ``transforms``: ``safe_augmentation``, timm's auto-augment ops with a ``posterize`` that every supported Pillow
  accepts.
* ``batch_augment``: timm's training transform split in two: ``BatchAugment.draw`` draws one sample's random
  parameters in a loader worker (seeded, cheap), ``BatchAugment(images, params)`` applies them to a whole batch with
  tensor ops on the training device; ``BatchEval``, timm's eval transform on a batch; ``UnsupportedAugmentation``.
* ``rand_augment``: timm's RandAugment for the batched path: the ``rand-...`` string read, one table from op name to
  (level function, batched op, geometric or not), the per-sample draw.
* ``batch_geometry``, ``batch_colour``, ``batch_misc``: the pixel ops behind them on uint8 batches, one argument per
  image: resize, crops and PIL's affine transforms; PIL's ``ImageOps``/``ImageEnhance`` (``pil_*``) and torchvision's
  ColorJitter ops (``tv_*``); normalisation and random erasing.
* ``folders``: ``open_dataset``, an ImageFolder split (``DATA/SPLIT/CLASS/IMAGE``) whose unreadable images either stop
  the run with one line naming the file (default) or are skipped and logged once each (``skip_bad_images``).
* ``readers``: ``open_reader_datasets``, ``--data READER/...`` (timm's ``wds``, ``hfds``, ``hfids``, ``tfds``
  readers): streams become ``StreamDataset``, the map-style ``hfds`` a ``ReaderDataset``; ``num_images`` and
  ``class_names`` of any opened split.
"""
