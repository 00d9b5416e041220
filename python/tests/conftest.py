"""Shared helpers of the Python tests: the C++ tools the build registered (ctest passes their paths
as EMBCACHE_TRAIN, EMBCACHE_SYNTH, EMBCACHE_APPLY) and a check that a call releases the GIL."""

import os
import subprocess
import sys
import threading
import time

import pytest


def tool(name):
    """Path of a C++ tool; the test is skipped when the build did not register it."""
    path = os.environ.get(name)
    if not path or not os.path.exists(path):
        pytest.skip(f"{name} is not set (run through ctest)")
    return path


def run_tool(args):
    done = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert done.returncode == 0, f"{' '.join(map(str, args))} failed:\n{done.stdout}"
    return done.stdout


@pytest.fixture(scope="session")
def synth_dataset(tmp_path_factory):
    """A small synthetic Criteo-like dataset folder: 3 shards of 400 rows."""
    out = tmp_path_factory.mktemp("data") / "synth"
    run_tool([tool("EMBCACHE_SYNTH"), "--output", str(out), "--format", "shards", "--rows", "1200",
              "--rows-per-shard", "400", "--seed", "3", "--cardinality-scale", "0.001"])
    return str(out)


def runs_without_the_gil(call, repeats=50):
    """True when the main thread ran Python code while another thread was inside `call`.

    The switch interval is raised so that the interpreter never takes the GIL from the calling
    thread by itself: the main thread can only run while that thread has released it. The other
    thread repeats the call (at most `repeats` times) until the main thread saw it inside, so a
    busy machine that schedules the main thread late only makes the test take longer.
    """
    entered = threading.Event()
    state = {"inside": False, "seen": False}

    def worker():
        for _ in range(repeats):
            state["inside"] = True
            entered.set()
            call()
            state["inside"] = False
            if state["seen"]:
                break

    old = sys.getswitchinterval()
    sys.setswitchinterval(100.0)
    try:
        t = threading.Thread(target=worker)
        t.start()
        entered.wait()
        while t.is_alive():
            if state["inside"]:
                state["seen"] = True
            time.sleep(0.0005)
        t.join()
    finally:
        sys.setswitchinterval(old)
    return state["seen"]
