"""A safetensors file read without torch: its header (every tensor's dtype, shape and byte offsets, and the metadata
where a T-CNN file keeps its settings) and the values of a few small float tensors.

The layout (safetensors' own): an 8-byte little-endian header length, that many bytes of JSON, then the tensors'
bytes at the header's ``data_offsets``, counted from the end of the header. ``tcnn info`` reads a ``.safetensors``
T-CNN file through here: its settings and its GPSA layers' head parameters (a few dozen numbers) in milliseconds,
where importing torch alone takes seconds. Loading a file (``tcnn.files.tcnn_file``) goes through safetensors'
own reader, which checks the whole file; when that reader fails, ``tcnn.files.integrity.safetensors_damage`` says
what is wrong with the file's layout from the pieces here (``read_header_length``, ``read_header``, ``data_end``).
"""
import json
import math
import struct
from typing import Any, BinaryIO, Dict, List, Optional, Sequence, Tuple

from ..version import FORMAT_NAME, FORMAT_VERSION, PLAIN_FORMAT_VERSION

__all__ = ['METADATA_KEY', 'MAX_HEADER_BYTES', 'read_header_length', 'read_header', 'data_end', 'read_floats',
           'read_tcnn_settings']

METADATA_KEY = 'tcnn'  # the metadata entry that holds a T-CNN file's settings, as JSON
# safetensors' own limit on the header's length (a few hundred KB at most in a T-CNN file): a longer "length" is other
# bytes, and is not read into memory
MAX_HEADER_BYTES = 100 * 2 ** 20
# safetensors dtype -> struct code; a BF16 value is the upper half of a float32, read as an unsigned 16-bit integer
FLOAT_DTYPES = {'F64': 'd', 'F32': 'f', 'F16': 'e', 'BF16': 'H'}


def read_header_length(f: BinaryIO) -> int:
    """The length in bytes of the JSON header of the safetensors file open in ``f`` (at its start): its first 8
    bytes, a little-endian unsigned integer.

    Raises:
        ValueError: The file is shorter than 8 bytes.
    """
    head = f.read(8)
    if len(head) != 8:
        raise ValueError('shorter than the 8-byte header length')
    return struct.unpack('<Q', head)[0]


def read_header(f: BinaryIO) -> Tuple[Dict[str, Any], int]:
    """``(header, data_start)`` of the safetensors file open in ``f`` (at its start): the JSON header (tensor name
    -> its ``dtype``, ``shape``, ``data_offsets``; ``'__metadata__'`` -> a dict of strings) and where the tensors'
    bytes start.

    Raises:
        ValueError: Not a safetensors header (too short, too long, not JSON (``json.JSONDecodeError``), not a JSON
            object).
    """
    size = read_header_length(f)
    if size > MAX_HEADER_BYTES:
        raise ValueError(f'a header of {size} bytes')
    header = json.loads(f.read(size))
    if not isinstance(header, dict):
        raise ValueError('the header is not a JSON object')
    return header, 8 + size


def data_end(header: Dict[str, Any]) -> int:
    """Where the last tensor's bytes end, counted from ``data_start`` (0 without tensors).

    Raises:
        TypeError, KeyError, IndexError, ValueError: An entry without ``data_offsets`` of two integers.
    """
    return max((int(entry['data_offsets'][1]) for name, entry in header.items() if name != '__metadata__'), default=0)


def read_floats(f: BinaryIO, data_start: int, entry: Dict[str, Any]) -> List[Any]:
    """The values of one float tensor (``entry``: its header entry) as Python floats: a list, or a list of rows for a
    2-D tensor (e.g. ``pos_centers``, ``(N_h, 2)``).

    Raises:
        KeyError: Not a float dtype of ``FLOAT_DTYPES``.
        struct.error: Other bytes than the shape needs (a truncated file, offsets that do not fit the shape).
    """
    begin, end = entry['data_offsets']
    shape = entry['shape']
    f.seek(data_start + begin)
    flat = list(struct.unpack(f'<{math.prod(shape)}{FLOAT_DTYPES[entry["dtype"]]}', f.read(end - begin)))
    if entry['dtype'] == 'BF16':
        flat = [struct.unpack('<f', struct.pack('<I', v << 16))[0] for v in flat]
    if len(shape) == 2:
        return [flat[i * shape[1]:(i + 1) * shape[1]] for i in range(shape[0])]
    return flat


def read_tcnn_settings(path: str, suffixes: Sequence[str] = ()) -> Optional[Dict[str, Any]]:
    """The settings of a ``.safetensors`` T-CNN file (the dict ``tcnn.files.tcnn_file.read`` gives, without its
    ``'state_dict'``) and, under ``'tensor_values'``, the values (``read_floats``) of its float tensors whose names end
    with one of ``suffixes``.

    Returns:
        The dict, or None when the file is anything but a well-formed T-CNN file of a format this tcnn reads: the
        caller then reads it the full way, which says what is wrong.
    """
    try:
        with open(path, 'rb') as f:
            header, data_start = read_header(f)
            metadata = header.get('__metadata__') or {}
            settings = json.loads(metadata.get(METADATA_KEY, 'null'))
            if not (isinstance(settings, dict) and settings.get('format') == FORMAT_NAME
                    and settings.get('version') in (PLAIN_FORMAT_VERSION, FORMAT_VERSION)
                    and isinstance(settings.get('source'), dict)):
                return None
            values = {name: read_floats(f, data_start, entry) for name, entry in header.items()
                      if name.endswith(tuple(suffixes)) and entry.get('dtype') in FLOAT_DTYPES}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, struct.error):
        return None
    return dict(settings, tensor_values=values)
