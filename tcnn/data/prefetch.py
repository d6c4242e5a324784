"""Batches finished ahead of the training loop by a thread of its own: the batched pipelines' decode and augmentation
(``tcnn.data.encoded.DeviceLoader``, ``tcnn.data.resident.ResidentLoader``) on a GPU, while the step runs.

Why a thread: the training loop reads its loss once per update (the non-finite check before the optimizer step), so
a batch finished in the loop itself waits for the step, and the GPU waits for the batch's launches: measured on an
H100, nvjpeg and the augmentation between the steps left the GPU idle 57% of the time (docs/benchmarks.md, "Feeding
the model"). Torch releases the GIL inside every operator and in nvjpeg's call, so a thread's work overlaps the
step's; loader workers cannot do it, CUDA does not run in forked processes. On a CUDA device the thread works on a
stream of its own, and each batch is handed over with an event that the consumer's stream waits for
(``record_stream`` keeps the caching allocator from reusing its memory early).
"""
import contextlib
import queue
import threading
from typing import Any, Callable, Iterator, Tuple

import torch

__all__ = ['FinishedAhead', 'default_prefetch']

Batch = Tuple[torch.Tensor, torch.Tensor]


def default_prefetch(device: torch.device) -> int:
    """Batches a thread finishes ahead of the training loop on ``device``: 2 on a GPU; none on the CPU, where the
    step already takes every core."""
    return 2 if device.type == 'cuda' else 0


def _finish_ahead(batches: Iterator, finish: Callable[[Any], Batch], device: torch.device, out: queue.Queue,
                  stop: threading.Event) -> None:
    """``FinishedAhead``'s thread: finish each batch, queue it with the CUDA event that marks it ready."""
    def put(item: Tuple[str, Any]) -> bool:  # False: the consumer closed the iterator
        while not stop.is_set():
            try:
                out.put(item, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    try:  # all of it: an error anywhere here must reach the consumer, which would otherwise wait for a batch
        cuda = device.type == 'cuda'
        if cuda and device.index is not None:  # a new thread's current device is the first GPU: this process may
            torch.cuda.set_device(device)      # train on another
        stream = torch.cuda.Stream(device) if cuda else None
        with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
            for batch in batches:
                if stop.is_set():
                    return
                images, targets = finish(batch)
                event = None
                if cuda:
                    event = torch.cuda.Event()
                    event.record(stream)
                if not put(('batch', (images, targets, event))):
                    return
    except BaseException as e:  # noqa: BLE001 - raised again in the consumer, at its batch
        put(('error', e))
        return
    put(('end', None))


class FinishedAhead:
    """An iterator of ``finish(batch)`` for each of ``batches``, finished ``depth`` ahead by a thread of its own
    (on a CUDA ``device``: on a stream of its own), handed out in order; an exception of ``batches`` or of
    ``finish`` is raised where its batch would have come. Dropping it (or ``close``) stops the thread: at most
    ``depth + 1`` batches are finished beyond the last one taken.
    """

    def __init__(self, batches: Iterator, finish: Callable[[Any], Batch], device: torch.device, depth: int):
        self._queue: 'queue.Queue[Tuple[str, Any]]' = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._ended = False
        # the thread holds the queue and the flag, not this object: a consumer that drops the iterator closes it
        self._thread = threading.Thread(target=_finish_ahead, args=(batches, finish, device, self._queue, self._stop),
                                        name='tcnn-finish', daemon=True)
        self._thread.start()

    def __iter__(self) -> 'FinishedAhead':
        return self

    def __next__(self) -> Batch:
        if self._ended:
            raise StopIteration
        kind, value = self._get()
        if kind != 'batch':
            self._ended = True
            self.close()
            if kind == 'error':
                raise value
            raise StopIteration
        images, targets, event = value
        if event is not None:  # made on the thread's stream, read on this one's
            current = torch.cuda.current_stream(images.device)
            current.wait_event(event)
            images.record_stream(current)
            targets.record_stream(current)
        return images, targets

    def _get(self) -> Tuple[str, Any]:
        """The thread's next item; an error if the thread ended without one (its last put failed): never a wait
        without end."""
        while True:
            try:
                return self._queue.get(timeout=1.0)
            except queue.Empty:
                if not self._thread.is_alive():
                    with contextlib.suppress(queue.Empty):  # what it put just before it ended
                        return self._queue.get_nowait()
                    raise RuntimeError('the thread that finishes batches ended without a batch or an error') from None

    def close(self) -> None:
        """Stop the thread (a consumer that leaves early: the end of an epoch's updates, a stop request) and release
        the batches it finished ahead.

        The queue is emptied after the join: a put the thread had begun may still land after ``stop`` is set (it
        waits up to 0.1 s for room), and a batch left in the queue would hold its memory until this object goes. A
        thread still inside ``finish`` after the second's wait puts nothing more (``put`` looks at ``stop`` first).
        """
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)
        with contextlib.suppress(queue.Empty):
            while True:
                self._queue.get_nowait()

    def __del__(self) -> None:
        self.close()
