"""What identifies this tcnn and the files it writes: the package version and the T-CNN file format (name, version,
extensions). Free of imports, so the CLI can check an output path before torch loads."""

__all__ = ['__version__', 'FORMAT_NAME', 'FORMAT_VERSION', 'EXTENSIONS']

__version__ = '0.2.0'
FORMAT_NAME = 'tcnn'
FORMAT_VERSION = 2  # 2: GPSA filters as (C_out, N_h, C_in); version 1 files (2-D filters) are read and upgraded
EXTENSIONS = ('.pt', '.pth', '.safetensors')
