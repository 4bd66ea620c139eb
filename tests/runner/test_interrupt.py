"""StopSignals: a first SIGINT/SIGTERM during the rounds waits for the round's end, a second (or one before the
rounds) stops at once; the previous handlers come back, Ray's own SIGTERM handler overridden while a run lasts."""
import os
import signal

import pytest

from raysim.errors import RunInterrupted
from raysim.runner.interrupt import StopSignals


def test_a_first_signal_waits_for_the_round_and_a_second_stops_at_once():
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals() as signals:
        signals.at_round_end = True
        os.kill(os.getpid(), signal.SIGTERM)
        assert signals.received == signal.SIGTERM
        with pytest.raises(RunInterrupted) as stop:
            os.kill(os.getpid(), signal.SIGINT)
        assert stop.value.signum == signal.SIGINT and stop.value.name == "SIGINT"  # the one that stopped it
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_signal_before_the_rounds_stops_at_once_and_install_takes_the_handlers_back():
    before = signal.getsignal(signal.SIGINT)  # default_int_handler, or a handler Tune left in this process
    with StopSignals() as signals:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as ray.init does for SIGTERM
        signals.install()
        with pytest.raises(RunInterrupted, match="interrupted by SIGINT before its first round"):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before
