"""``ansible-playbook``, plus a record of the controller process's own CPU time.

bench/_common.run_playbook runs this instead of .venv/bin/ansible-playbook: the
same entry point (ansible.cli.playbook.main), with an exit hook that writes
``getrusage(RUSAGE_SELF)`` (the controller's main process: strategy,
templating, result handling) and ``RUSAGE_CHILDREN`` (its forked workers and
the modules they ran) to $GPUFLEET_BENCH_RUSAGE. Workers end with os._exit, so
the hook runs only in the main process. It also counts the fork workers the
run starts (one per host and task that reaches a worker: WorkerProcess.start,
counted in the main process). With $GPUFLEET_BENCH_CPROFILE set, the main
process runs under cProfile and the stats go to that path.
"""
from __future__ import annotations

import atexit
import json
import os
import resource
import sys

MAIN_PID = os.getpid()
WORKERS = [0]


def _dump():
    path = os.environ.get("GPUFLEET_BENCH_RUSAGE")
    if not path or os.getpid() != MAIN_PID:
        return
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(path, "w") as fh:
        json.dump({"self": me.ru_utime + me.ru_stime, "children": kids.ru_utime + kids.ru_stime,
                   "workers": WORKERS[0]}, fh)


def _count_workers():
    from ansible.executor.process.worker import WorkerProcess  # pylint: disable=import-outside-toplevel
    start = WorkerProcess.start

    def counted_start(self):
        WORKERS[0] += 1
        return start(self)

    WorkerProcess.start = counted_start


def _profile_workers(outdir):
    """Each fork worker's task under cProfile: <outdir>/<action>-<pid>.prof (templating, AnsiballZ, connection)."""
    import cProfile  # pylint: disable=import-outside-toplevel
    from ansible.executor.process.worker import WorkerProcess  # pylint: disable=import-outside-toplevel
    run = WorkerProcess._run  # pylint: disable=protected-access

    def profiled(self):
        prof = cProfile.Profile()
        try:
            return prof.runcall(run, self)
        finally:
            action = str(getattr(self._task, "action", "task")).replace("/", "_")  # pylint: disable=protected-access
            prof.dump_stats(os.path.join(outdir, "%s-%d.prof" % (action, os.getpid())))

    WorkerProcess._run = profiled  # pylint: disable=protected-access


def main():
    atexit.register(_dump)
    from ansible.cli.playbook import main as playbook_main  # pylint: disable=import-outside-toplevel
    _count_workers()
    if os.environ.get("GPUFLEET_BENCH_WORKER_PROFILE"):
        _profile_workers(os.environ["GPUFLEET_BENCH_WORKER_PROFILE"])
    sys.argv[0] = "ansible-playbook"
    prof_path = os.environ.get("GPUFLEET_BENCH_CPROFILE")
    if not prof_path:
        return playbook_main()
    import cProfile  # pylint: disable=import-outside-toplevel
    prof = cProfile.Profile()
    try:
        return prof.runcall(playbook_main)
    finally:
        if os.getpid() == MAIN_PID:
            prof.dump_stats(prof_path)


if __name__ == "__main__":
    sys.exit(main())
