"""Many readers and writers at once; speed of a call; GPUSIM_SMI_DELAY."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from gpusim import smi
from gpusim_testlib import SIM_BIN


def test_polling_readers_see_consistent_state(sim):
    """Readers poll every 50 ms while holds come and go: every answer must be
    well-formed CSV whose memory figures add up."""
    stop = threading.Event()
    errors, samples = [], []

    def reader():
        while not stop.is_set():
            p = subprocess.run(
                [str(SIM_BIN / "nvidia-smi"),
                 "--query-gpu=index,memory.used,memory.free,memory.reserved,memory.total",
                 "--format=csv,noheader,nounits"],
                env=sim.env, capture_output=True, timeout=30, check=False)
            if p.returncode != 0 or p.stderr:
                errors.append(p)
            else:
                lines = p.stdout.decode().splitlines()
                if len(lines) != 8:
                    errors.append(p)
                for line in lines:
                    i, used, free, res, total = (int(x) for x in line.split(", "))
                    if total != used + free + res:
                        errors.append(line)
                samples.append(lines)
            time.sleep(0.05)

    threads = [threading.Thread(target=reader) for _thread in range(2)]
    for t in threads:
        t.start()
    try:
        for k in range(4):
            pid = sim.hold("--gpus", "%d,%d" % (k, k + 4), "--mib", "1000")
            if k % 2:
                os.kill(pid, signal.SIGKILL)
            sim.gpusim("orphan", "--gpu", str(k), "--mib", "10")
    finally:
        time.sleep(0.2)
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors[:3]
    assert len(samples) >= 2


def test_racing_holds_never_overcommit(sim):
    """Two holds that fit only one at a time: the lock makes exactly one win."""
    free = int(sim.query_gpu("memory.free", ids="0")[0][0])
    mib = free // 2 + 1
    results = []

    def go():
        results.append(sim.gpusim("hold", "--gpus", "0", "--mib", str(mib)))

    threads = [threading.Thread(target=go) for _thread in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    ok = [r for r in results if r.rc == 0]
    for r in ok:
        sim.track_hold(int(r.out))
    assert len(ok) == 1, results
    assert all(r.rc == 2 and "CUDA out of memory" in r.err for r in results if r.rc != 0)
    assert sim.used(0) == 1 + mib


def test_in_process_call_is_fast(sim):
    pid = sim.hold("--gpus", "0,1", "--mib", "10")
    env = dict(sim.env)
    argv = ["--query-compute-apps=pid,used_memory", "--format=csv,noheader"]
    rc, out, _err = smi.run(argv, env)
    assert rc == 0 and out.count(str(pid)) == 2
    t0 = time.perf_counter()
    for _attempt in range(20):
        smi.run(argv, env)
    per_call = (time.perf_counter() - t0) / 20
    assert per_call < 0.03, "nvidia-smi logic took %.1f ms per call" % (per_call * 1e3)


def test_smi_delay_knob(sim):
    t0 = time.monotonic()
    r = sim.smi("-L", env={"GPUSIM_SMI_DELAY": "0.4"})
    assert r.rc == 0 and len(r.lines) == 8
    assert time.monotonic() - t0 >= 0.4


def test_smi_imports_stay_light(sim):
    """The hot path must not import json/re/argparse (startup cost)."""
    code = ("import sys; sys.argv=['nvidia-smi','--query-gpu=index','--format=csv'];"
            "sys.path.insert(0, %r); from gpusim import smi; smi.main();"
            "bad=[m for m in ('json','re','argparse','subprocess') if m in sys.modules];"
            "sys.stderr.write(repr(bad))") % str(SIM_BIN.parent / "python")
    p = subprocess.run([sys.executable, "-S", "-c", code], env=sim.env, capture_output=True,
                       timeout=30, check=False)
    assert p.returncode == 0, p
    assert p.stderr == b"[]", p.stderr
