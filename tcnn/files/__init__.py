"""What tcnn reads and writes: the T-CNN file format, source weights and CNNs, Hub folders, and their checksums."""
