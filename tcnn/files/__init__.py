"""What tcnn reads and writes: the T-CNN file format (``tcnn_file``), weight files (``weights``), where source CNNs
come from (``sources``), Hub folders (``hub_folder``), a training run's folder (``run_folder``), ``tcnn.load`` for all
of them (``loading``), the checksums of stored tensors (``integrity``), and a ``.safetensors`` file's header and small
tensors read without torch (``safetensors_header``, for ``tcnn info``)."""
