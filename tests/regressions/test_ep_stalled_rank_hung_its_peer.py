"""Regression: a rank that stops reading (stuck or suspended, not dead) hung its peer forever:
the peer's ``dist.send`` of a message larger than the socket buffers blocked under the gloo
group's 7-day timeout, although ``PTO_DIST_TIMEOUT`` promises that a stuck rank is caught. A send
is now bounded by the timeout and fails with a DistributedError naming both ranks. And a rank
killed by a signal made ``spawn`` (``--ep N``) return its negative code, an exit status of 247
outside pto's codes: it now names the rank and signal and returns the ranks' own code, or 1."""

import textwrap
import time

from pto.runtime import distributed as dist

SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    import torch
    from pto.errors import DistributedError
    from pto.runtime import distributed as dist

    mode = sys.argv[1]
    w = dist.init(timeout_s=2.0)
    if mode == "stall":
        if w.rank == 1:
            os.kill(os.getpid(), signal.SIGSTOP)  # stops reading; never resumes
        time.sleep(0.5)
        t0 = time.monotonic()
        try:
            w.transport.send(1, 0, None, torch.zeros(64 << 20, dtype=torch.uint8))
        except DistributedError as e:
            print(f"{time.monotonic() - t0:.1f} {e}", file=sys.stderr, flush=True)
            os._exit(3)
        os._exit(0)
    if mode == "kill":
        if w.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.5)
        os._exit(0)
""")


def test_a_send_to_a_rank_that_stopped_reading_fails_within_the_timeout(tmp_path, capfd):
    script = tmp_path / "stall.py"
    script.write_text(SCRIPT)
    t0 = time.monotonic()
    code = dist.spawn(["stall"], 2, script=str(script), grace_s=1.0, timeout_s=2.0)
    took = time.monotonic() - t0
    err = capfd.readouterr().err
    assert code == 3, err
    assert "rank 0: sending to rank 1 made no progress within 2 s (PTO_DIST_TIMEOUT): rank 1 stopped reading" in err
    assert took < 60  # the old send waited for days


def test_a_rank_killed_by_a_signal_is_named_and_exits_1(tmp_path, capfd):
    script = tmp_path / "kill.py"
    script.write_text(SCRIPT)
    code = dist.spawn(["kill"], 2, script=str(script), grace_s=1.0, timeout_s=5.0)
    assert code == 1
    assert "error: rank 1 was killed by signal SIGKILL" in capfd.readouterr().err
