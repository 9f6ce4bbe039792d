"""The one definition of time (hisparse.timing): a phase's CUDA-event time where recorded, else
its wall time; the host timing loop of the peers; the phase timer's per-repeat sums."""
import time

import numpy as np
import pytest

from hisparse.timing import PhaseTimer, StepClock, event_else_wall, time_on_host


def test_event_time_where_recorded_else_wall_time():
    wall = np.array([[1.0, 2.0, np.nan], [4.0, np.nan, 6.0]])
    gpu = np.array([[0.5, np.nan, np.nan], [np.inf, np.nan, 0.25]])
    chosen = event_else_wall(wall, gpu)
    # an infinite (never finished) event interval is no measurement: the wall time serves
    np.testing.assert_array_equal(chosen, [[0.5, 2.0, np.nan], [4.0, np.nan, 0.25]])
    assert float(event_else_wall(3.0, np.nan)) == 3.0
    assert float(event_else_wall(3.0, 0.125)) == 0.125


def test_host_loop_times_each_repeat_of_the_body():
    calls = []

    def body():
        calls.append(time.perf_counter())
        time.sleep(0.01 * len(calls))

    seconds = time_on_host(body, 3)
    assert len(seconds) == 3 and len(calls) == 3
    for k, value in enumerate(seconds, start=1):
        assert 0.01 * k <= value < 0.01 * k + 0.5
    assert time_on_host(body, 0) == [] and len(calls) == 3


def test_phase_timer_sums_pieces_per_repeat_and_keeps_setup_in_row_zero():
    timer = PhaseTimer(["read", "kernel", "total"])
    timer.add("read", wall=2.0)
    for repeat in range(2):
        timer.begin_repeat(repeat)
        timer.add("kernel", wall=0.5, gpu=0.25)
        timer.add("kernel", wall=0.5 * (repeat + 1), gpu=0.25)
    wall, gpu = timer.arrays(2)
    assert wall[0, 0] == 2.0 and np.isnan(wall[1, 0])
    np.testing.assert_array_equal(wall[:, 1], [1.0, 1.5])
    np.testing.assert_array_equal(event_else_wall(wall, gpu)[:, 1], [0.5, 0.5])
    assert np.isnan(wall[:, 2]).all()
    with pytest.raises(KeyError, match="'solve' is not declared"):
        with timer.phase("solve"):
            pass


def test_step_clock_splits_a_phase_into_its_steps_and_adds_repeated_ones():
    clock = StepClock()
    time.sleep(0.02)
    clock.mark("first")
    time.sleep(0.01)
    clock.mark("second")
    time.sleep(0.02)
    clock.mark("first")  # a step marked again adds up
    assert list(clock.seconds) == ["first", "second"]
    assert clock.seconds["first"] >= 0.04 and 0.01 <= clock.seconds["second"] < 0.04
