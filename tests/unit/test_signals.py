"""Stop signals are acted on off the handler (``system.signals``): the handler takes no lock, so a main thread
interrupted while holding one (an Event's condition in a tight wait loop) never waits on itself."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

from loopsq.system.signals import SignalPipe, stop_on_signals

# A child that, 300 times, waits in a tight `while not stop.wait(0)` loop while a thread sends it a signal. Setting
# the event inside the handler deadlocks in about half of such tries (seen: 167 of 300 processes hung); through
# the pipe none does. ARM picks how the signal sets the event.
CHILD = textwrap.dedent("""
    import os, random, signal, sys, threading, time
    from loopsq.system.signals import stop_on_signals
    stop = threading.Event()
    if sys.argv[1] == "pipe":
        pipe = stop_on_signals(stop, signals=(signal.SIGUSR1,))
    else:
        signal.signal(signal.SIGUSR1, lambda *_: stop.set())
    for _ in range(300):
        stop.clear()
        sender = threading.Thread(target=lambda: (time.sleep(random.random() / 2000), os.kill(os.getpid(), signal.SIGUSR1)))
        sender.start()
        while not stop.wait(0):
            pass
        sender.join()
    print("done", flush=True)
""")


def run_child(arm: str, timeout: float) -> str:
    try:
        done = subprocess.run([sys.executable, "-c", CHILD, arm], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "hung"
    return done.stdout.strip() or done.stderr


def test_a_signal_sets_the_stop_event_without_ever_deadlocking_a_tight_wait_loop() -> None:
    assert run_child("pipe", 60) == "done"  # (about a second on a quiet machine)


def test_the_handler_that_sets_the_event_itself_does_deadlock_there_which_is_what_the_pipe_avoids() -> None:
    # (the premise: if this ever stops hanging, the test above proves nothing)
    assert run_child("handler", 8) == "hung"


def test_the_first_signal_goes_to_the_thread_and_a_repeat_to_the_handler_callback() -> None:
    import os
    import signal

    seen: list[str] = []
    acted = threading.Event()

    def act(signum: int) -> None:
        seen.append(f"thread {signum} on {threading.current_thread().name}")
        acted.set()

    pipe = SignalPipe(act, name="t-signals", repeat=lambda signum, _frame: seen.append(f"repeat {signum}"))
    pipe.install((signal.SIGUSR1,))
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert acted.wait(10)
        os.kill(os.getpid(), signal.SIGUSR1)
    finally:
        pipe.restore()
    assert seen == [f"thread {int(signal.SIGUSR1)} on t-signals", f"repeat {int(signal.SIGUSR1)}"]
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL


def test_stop_on_signals_says_once_and_sets_the_event() -> None:
    import os
    import signal

    stop = threading.Event()
    said: list[str] = []
    previous = signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    pipe = stop_on_signals(stop, say=lambda: said.append("stop signal received"), signals=(signal.SIGUSR2,))
    try:
        os.kill(os.getpid(), signal.SIGUSR2)
        assert stop.wait(10)
        os.kill(os.getpid(), signal.SIGUSR2)
    finally:
        pipe.restore()
        signal.signal(signal.SIGUSR2, previous)
    assert said == ["stop signal received"]
