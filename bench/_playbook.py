"""``ansible-playbook``, plus a record of the controller process's own CPU time.

bench/_common.run_playbook runs this instead of .venv/bin/ansible-playbook: the
same entry point (ansible.cli.playbook.main), with an exit hook that writes
``getrusage(RUSAGE_SELF)`` (the controller's main process: strategy,
templating, result handling) and ``RUSAGE_CHILDREN`` (its forked workers and
the modules they ran) to $GPUFLEET_BENCH_RUSAGE. Workers end with os._exit, so
the hook runs only in the main process. With $GPUFLEET_BENCH_CPROFILE set, the
main process runs under cProfile and the stats go to that path.
"""
from __future__ import annotations

import atexit
import json
import os
import resource
import sys

MAIN_PID = os.getpid()


def _dump():
    path = os.environ.get("GPUFLEET_BENCH_RUSAGE")
    if not path or os.getpid() != MAIN_PID:
        return
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(path, "w") as fh:
        json.dump({"self": me.ru_utime + me.ru_stime, "children": kids.ru_utime + kids.ru_stime}, fh)


def main():
    atexit.register(_dump)
    from ansible.cli.playbook import main as playbook_main  # pylint: disable=import-outside-toplevel
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
