"""What identifies this tcnn and the files it writes: the package version and the T-CNN file format (name, version,
extensions). Free of imports, so the CLI can check an output path before torch loads."""

__all__ = ['__version__', 'FORMAT_NAME', 'FORMAT_VERSION', 'PLAIN_FORMAT_VERSION', 'EXTENSIONS', 'EXPORT_EXTENSIONS']

__version__ = '0.7.0'
FORMAT_NAME = 'tcnn'
# The newest T-CNN file format this tcnn reads and writes. 3: grouped and depthwise GPSA layers stored per group
# (tcnn 0.3). Files without such layers are written as version 2 (GPSA filters as (C_out, N_h, C_in), tcnn 0.2), which
# tcnn 0.2 reads too, while it refuses a version 3 file with 'upgrade tcnn' instead of a shape error. Version 1
# files (tcnn 0.1, 2-D filters) are read and upgraded.
FORMAT_VERSION = 3
PLAIN_FORMAT_VERSION = 2
EXTENSIONS = ('.pt', '.pth', '.safetensors')
# Formats of `tcnn export` (tcnn.export): ONNX, torch.export's archive or AOTInductor package, ExecuTorch's program
EXPORT_EXTENSIONS = ('.onnx', '.pt2', '.pte')
