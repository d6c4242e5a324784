"""tcnn.train.distributed.StopRequest: how a run is asked to stop. A cluster's SIGTERM or SIGUSR1 and a first Ctrl-C
become a request the loop honours at its next update (then it saves and exits 75, or 130 for Ctrl-C); a second Ctrl-C
interrupts at once. The handler is called here as Python calls it (tests/test_train_reliability.py sends real
signals to training processes)."""
import signal

import pytest

from tcnn.train.distributed import EXIT_INTERRUPTED, EXIT_PREEMPTED, StopRequest


def test_a_first_ctrl_c_asks_for_a_stop_and_a_second_interrupts_at_once():
    stop = StopRequest()
    assert not stop.requested
    stop._handle(signal.SIGINT, None)
    assert stop.requested and stop.signal_name == 'SIGINT' and stop.exit_code == EXIT_INTERRUPTED == 130
    with pytest.raises(KeyboardInterrupt):
        stop._handle(signal.SIGINT, None)


@pytest.mark.parametrize('first', ['SIGTERM', 'SIGUSR1'])
def test_a_preemption_signal_asks_for_a_stop_and_the_first_signal_names_it(first):
    stop = StopRequest()
    stop._handle(getattr(signal, first), None)
    assert stop.signal_name == first and stop.exit_code == EXIT_PREEMPTED == 75
    # what comes after does not change the request, and a Ctrl-C after a preemption is no second Ctrl-C
    stop._handle(signal.SIGINT, None)
    stop._handle(signal.SIGTERM, None)
    assert stop.signal_name == first and stop.exit_code == EXIT_PREEMPTED


def test_a_preemption_after_a_ctrl_c_waits_for_the_update_as_the_ctrl_c_does():
    stop = StopRequest()
    stop._handle(signal.SIGINT, None)
    stop._handle(signal.SIGTERM, None)
    assert stop.signal_name == 'SIGINT' and stop.exit_code == EXIT_INTERRUPTED


def test_the_handlers_are_installed_in_the_main_thread_and_the_previous_ones_come_back():
    before = {name: signal.getsignal(getattr(signal, name)) for name in StopRequest.SIGNALS}
    with StopRequest() as stop:
        for name in StopRequest.SIGNALS:
            assert signal.getsignal(getattr(signal, name)) == stop._handle
        stop.request('SIGUSR1')
        stop.request('SIGTERM')
        assert stop.signal_name == 'SIGUSR1'
    assert {name: signal.getsignal(getattr(signal, name)) for name in StopRequest.SIGNALS} == before
