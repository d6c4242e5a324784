"""Image decoding for the batched data pipelines: JPEG file bytes decoded a batch at a time on a device (nvjpeg on a
GPU, libjpeg-turbo on the CPU), other formats through Pillow, as the PIL pipeline reads them.

One function, ``decode_batch``, stands in front of the decoders that the installed packages have: torchvision's
``decode_jpeg`` (a list of images in one nvjpeg batch on CUDA; deprecated from torchvision 0.29 in favour of
TorchCodec, still shipped) and else TorchCodec's (``torchcodec.decoders.decode_jpeg``, one image per call). On the
CPU both give Pillow's pixels exactly (the same libjpeg-turbo, the same IDCT and upsampling: tests/test_data_pipeline.py
checks it); nvjpeg's IDCT differs by a few levels.
"""
import io
import warnings
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from PIL import Image

__all__ = ['JPEG_MODES', 'is_jpeg', 'jpeg_size', 'pil_to_tensor', 'decode_pil', 'decode_batch', 'decoder_name']

# Pillow modes of the JPEGs that go to the batched decoder; others (rare: CMYK, YCCK) are decoded by Pillow in the
# loader worker, as the PIL pipeline does
JPEG_MODES = ('RGB', 'L')


def is_jpeg(data: Union[bytes, memoryview]) -> bool:
    """Whether ``data`` starts like a JPEG file (the SOI marker and the next marker's 0xFF)."""
    return bytes(data[:3]) == b'\xff\xd8\xff'


def jpeg_size(data: bytes) -> Optional[Tuple[int, int]]:
    """(height, width) of a complete RGB or grayscale JPEG, read from its header; None for anything the batched
    decoder should not get: not a JPEG, another colour mode, or a file without its end marker (a truncated download,
    which Pillow refuses to decode: the PIL path then reports or skips it as it always did).

    Why the end marker: a batch decoder fails the whole batch on one bad file, and a cut file is by far the most
    common bad JPEG; the few that pass this check and still fail are found per image after a batch fails
    (``decode_batch``)."""
    if not is_jpeg(data) or not data.rstrip(b'\x00')[-2:] == b'\xff\xd9':
        return None
    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.format != 'JPEG' or img.mode not in JPEG_MODES:
                return None
            width, height = img.size
    except Exception:  # noqa: BLE001 - a header Pillow cannot read: the PIL path decides
        return None
    return height, width


def pil_to_tensor(img: Image.Image) -> torch.Tensor:
    """An RGB Pillow image as a uint8 (3, H, W) tensor."""
    return torch.from_numpy(np.array(img, dtype=np.uint8, copy=True)).permute(2, 0, 1).contiguous()


def decode_pil(data: bytes) -> torch.Tensor:
    """Any image file Pillow reads, as the PIL pipeline decodes it (``convert('RGB')``), as uint8 (3, H, W)."""
    with Image.open(io.BytesIO(data)) as img:
        return pil_to_tensor(img.convert('RGB'))


def _torchvision_decoder():
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
    except ImportError:
        return None

    def decode(encoded: List[torch.Tensor], device: torch.device) -> List[torch.Tensor]:
        with warnings.catch_warnings():  # torchvision >= 0.29 warns on every call that it prefers TorchCodec
            warnings.simplefilter('ignore', DeprecationWarning)
            warnings.simplefilter('ignore', UserWarning)
            return list(decode_jpeg(encoded, mode=ImageReadMode.RGB, device=device))
    return decode


def _torchcodec_decoder():
    try:
        from torchcodec.decoders import decode_jpeg
    except Exception:  # noqa: BLE001 - not installed, or its native libraries do not load
        return None

    def decode(encoded: List[torch.Tensor], device: torch.device) -> List[torch.Tensor]:
        return [decode_jpeg(e, mode='RGB', device=str(device)) for e in encoded]
    return decode


_DECODER = None


def _decoder():
    global _DECODER
    if _DECODER is None:
        for name, make in (('torchvision', _torchvision_decoder), ('torchcodec', _torchcodec_decoder)):
            fn = make()
            if fn is not None:
                _DECODER = (name, fn)
                break
        else:
            raise ImportError('decoding JPEGs in batches needs torchvision.io.decode_jpeg or torchcodec')
    return _DECODER


def decoder_name() -> str:
    """Which package decodes JPEG batches here (``torchvision`` or ``torchcodec``)."""
    return _decoder()[0]


def decode_batch(payloads: Sequence[torch.Tensor], device: Union[str, torch.device]
                 ) -> Tuple[List[Optional[torch.Tensor]], List[int]]:
    """Decode a batch on ``device``.

    Args:
        payloads: Per image, either the JPEG file's bytes (a 1-D uint8 CPU tensor: ``jpeg_size`` accepted it) or
            pixels decoded already (uint8 (3, H, W), moved to ``device``).
        device: Where the pixels go (and, for a CUDA device, where the JPEGs are decoded).

    Returns:
        The uint8 (3, H, W) images on ``device`` in order, None where a JPEG failed to decode, and the indices of
        those failures. One bad file does not fail the batch: after a failed batch call each JPEG is decoded alone.
    """
    device = torch.device(device)
    images: List[Optional[torch.Tensor]] = [None] * len(payloads)
    jpegs = [i for i, p in enumerate(payloads) if p.dim() == 1]
    for i, p in enumerate(payloads):
        if p.dim() == 3:
            images[i] = p.to(device, non_blocking=True)
    failed: List[int] = []
    if jpegs:
        decode = _decoder()[1]
        try:
            for i, img in zip(jpegs, decode([payloads[i] for i in jpegs], device)):
                images[i] = img
        except RuntimeError:
            for i in jpegs:
                try:
                    images[i] = decode([payloads[i]], device)[0]
                except RuntimeError:
                    failed.append(i)
    return images, failed
