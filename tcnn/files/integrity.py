"""Weights that went bad: checksums of stored tensors, and non-finite values in a model.

``torch.load`` and safetensors read whatever bytes a file holds: a byte overwritten inside a stored tensor loads
without a word and gives wrong (or NaN) logits. tcnn's own files (T-CNN files, training checkpoints, Hub folders of
``tcnn publish``) therefore carry one CRC-32 per tensor over its raw bytes (zlib's, in key order: a fraction of
``torch.load``'s own time, docs/benchmarks.md), which loading checks: a corrupt tensor is named, never computed with.
CRC-32 detects every error burst of up to 32 bits (a flipped byte, a few overwritten ones) with certainty and other
damage with probability 1 - 2**-32 per tensor; it guards against accidents (disks, transfers, truncated copies), not
against tampering. Files without checksums (tcnn 0.3.x and earlier, other tools) load unchecked.

When outputs are non-finite anyway, ``nonfinite_tensors`` names the parameters and buffers that hold NaN or inf.
"""
import os
import zlib
from typing import Any, Dict, List, Mapping, Optional

import torch
import torch.nn as nn

from ..errors import TcnnError
from .safetensors_header import MAX_HEADER_BYTES, data_end, read_header, read_header_length

__all__ = ['CHECKSUM_ALGORITHM', 'CorruptFileError', 'tensor_checksums', 'verify_checksums', 'safetensors_damage',
           'nonfinite_tensors', 'check_finite_outputs', 'nonfinite_text', 'nonfinite_kind', 'nonfinite_output_error',
           'NonFiniteOutputError', 'names_text']

CHECKSUM_ALGORITHM = 'crc32'
_FIX = 'the file is corrupt (re-download or re-save it)'


class CorruptFileError(TcnnError):
    """A file whose tensors do not match the checksums stored with them."""


class NonFiniteOutputError(TcnnError):
    """A model computed NaN or infinite outputs.

    Attributes:
        name: The model, as the message names it (a caller may re-word it with ``renamed``).
        detail: The rest of the message (what was non-finite, and why).
    """

    def __init__(self, name: str, detail: str):
        self.name, self.detail = name, detail
        super().__init__(f'{name} {detail}')

    def __reduce__(self):
        return type(self), (self.name, self.detail)

    def renamed(self, name: str) -> 'NonFiniteOutputError':
        """The same error naming the model ``name`` (e.g. the file it was loaded from)."""
        return type(self)(name, self.detail)


def _crc32(tensor: torch.Tensor) -> int:
    """CRC-32 of a tensor's raw bytes (row-major, as stored)."""
    data = tensor.detach().to('cpu').contiguous().reshape(-1).view(torch.uint8)
    return zlib.crc32(data.numpy()) if data.numel() else 0


def tensor_checksums(tensors: Mapping[str, torch.Tensor]) -> Dict[str, Any]:
    """What a file stores beside ``tensors``: ``{'algorithm': 'crc32', 'tensors': {name: CRC-32 of its bytes}}``
    (plain values: a torch dict entry, or JSON in safetensors metadata)."""
    return {'algorithm': CHECKSUM_ALGORITHM, 'tensors': {k: _crc32(v) for k, v in tensors.items()}}


def names_text(names: List[str], most: int = 3) -> str:
    """``'a, b, c (and 4 more)'``."""
    more = f' (and {len(names) - most} more)' if len(names) > most else ''
    return ', '.join(names[:most]) + more


def verify_checksums(tensors: Mapping[str, torch.Tensor], checksums: Any, where: str) -> None:
    """Check ``tensors`` against the ``checksums`` stored with them (``tensor_checksums``'s output); None (a file
    written before tcnn stored checksums) checks nothing.

    Raises:
        CorruptFileError: A tensor whose bytes do not match, a tensor added or lost, or a malformed checksum entry;
            one line naming ``where`` and the tensors.
    """
    if checksums is None:
        return
    stored = checksums.get('tensors') if isinstance(checksums, dict) else None
    if (not isinstance(stored, dict) or checksums.get('algorithm') != CHECKSUM_ALGORITHM
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in stored.values())):
        raise CorruptFileError(f'{where}: its tensor checksums are unreadable (algorithm '
                               f'{checksums.get("algorithm") if isinstance(checksums, dict) else None!r}): {_FIX}')
    lost = [k for k in stored if k not in tensors]
    added = [k for k in tensors if k not in stored]
    if lost or added:
        parts = [f'{label} {names_text(keys)}' for label, keys in (('missing', lost), ('unexpected', added)) if keys]
        raise CorruptFileError(f'{where}: its tensors differ from those its checksums list ({"; ".join(parts)}): '
                               f'{_FIX}')
    bad = [k for k, v in tensors.items() if not isinstance(v, torch.Tensor) or _crc32(v) != stored[k]]
    if len(bad) == 1:
        raise CorruptFileError(f'{where}: the tensor {bad[0]} does not match its checksum: {_FIX}')
    if bad:
        raise CorruptFileError(f'{where}: {len(bad)} tensors do not match their checksums ({names_text(bad)}): {_FIX}')


def safetensors_damage(path: str) -> Optional[str]:
    """What is wrong with a safetensors file, from its layout alone (an 8-byte little-endian header length, a JSON
    header, the tensors' bytes at the header's ``data_offsets``), read with ``tcnn.files.safetensors_header``:
    ``'truncated (N of its M bytes)'``, ``'corrupt (...)'``, or None when the layout holds (safetensors' own errors
    say only "Error while deserializing header")."""
    size = os.path.getsize(path)
    with open(path, 'rb') as f:
        try:
            length = read_header_length(f)
        except ValueError:
            return f'truncated ({size} bytes: not even the 8-byte header length of a safetensors file)'
        if 8 + length > size:
            if length > MAX_HEADER_BYTES:  # not a length but other bytes
                return 'corrupt (not a safetensors file: its first 8 bytes are no header length)'
            return f'truncated ({size} bytes: its header alone takes {8 + length})'
        f.seek(0)
        try:
            header, data_start = read_header(f)
            end = data_start + data_end(header)
        except (ValueError, TypeError, KeyError, IndexError) as e:
            return f'corrupt (its header is not a safetensors header: {type(e).__name__})'
    if end > size:
        return f'truncated ({size} of its {end} bytes)'
    return None


def nonfinite_tensors(model: nn.Module) -> List[str]:
    """Names of the parameters and buffers of ``model`` that hold a NaN or an infinity (floating point ones)."""
    named = list(model.named_parameters()) + list(model.named_buffers())
    return [name for name, t in named if t.is_floating_point() and not bool(torch.isfinite(t).all())]


def check_finite_outputs(output: torch.Tensor, model: nn.Module, what: str) -> None:
    """Raise a one-line ``TcnnError`` when ``output`` (a tensor ``model`` computed) holds NaN or infinity, naming the
    cause: ``model``'s parameters and buffers that hold non-finite values, or that all of them are finite (then an
    input or the computation overflows). ``what``: what was being done, the start of the message (e.g.
    ``'cannot export t_resnet50d.pt'``)."""
    if bool(torch.isfinite(output).all()):
        return
    bad = nonfinite_tensors(model)
    if bad:
        cause = (f'{len(bad)} of its parameters/buffers hold NaN or infinite values ({names_text(bad)}): the weights '
                 'are damaged (a corrupted file or a diverged training run); use an earlier checkpoint or reconvert')
    else:
        cause = ('its parameters and buffers are all finite, so the computation overflows (e.g. float16 range or '
                 'extreme inputs)')
    raise TcnnError(f'{what}: the model computes non-finite logits (NaN or infinity); {cause}')


def nonfinite_text(model: nn.Module) -> str:
    """Why a model's outputs may be non-finite, for a message: ``'2 of its parameters hold non-finite values (a, b)'``
    or that none does (then its input or its arithmetic overflowed)."""
    names = nonfinite_tensors(model)
    if not names:
        return ('its parameters and buffers are all finite: the computation overflows (reduced precision? try '
                'without --amp) or the input holds non-finite values')
    count = 'its parameter' if len(names) == 1 else f'{len(names)} of its parameters'
    verb = 'holds' if len(names) == 1 else 'hold'
    return f'{count} {verb} non-finite values ({names_text(names)}): the weights are damaged; re-download or re-train'


def nonfinite_kind(nan: int, inf: int) -> str:
    """``'NaN'``, ``'inf'`` or ``'NaN and inf'``."""
    return ' and '.join(k for k, n in (('NaN', nan), ('inf', inf)) if n) or 'non-finite'


def nonfinite_output_error(name: str, model: nn.Module, bad: int, total: int, nan: int, inf: int,
                           what: str = 'logits', of: Optional[str] = 'images') -> NonFiniteOutputError:
    """The error of a model that computed non-finite ``what`` on ``bad`` of ``total`` inputs (``nan`` of them with a
    NaN, ``inf`` with an infinity), naming the cause (``nonfinite_text``)."""
    return NonFiniteOutputError(name, f'computes non-finite {what} ({nonfinite_kind(nan, inf)}) on {bad} of {total} '
                                      f'{of}: {nonfinite_text(model)}')
