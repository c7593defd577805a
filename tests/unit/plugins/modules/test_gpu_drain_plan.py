"""Root selection and drain planning (module_utils/gpu/teardown_plan.py), as pure functions over synthetic process tables."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.sglang.plugins.module_utils.node import procfs
from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import teardown
from ansible_collections.gpufleet.sglang.plugins.module_utils.gpu import teardown_plan as gd

SVC = "/system.slice/sglang-main.service"
ANSIBLE_CHAIN = (9000, 8999, 8998)      # the module, its AnsiballZ wrapper, ansible-playbook


def P(pid, ppid, comm, cmdline=None, pgid=None, sid=None, start=None, state="S", unit=None, cgroup=None,
      manager="system", threads=1):
    return procfs.ProcInfo(pid=pid, ppid=ppid, pgid=pid if pgid is None else pgid, sid=pid if sid is None else sid,
                           state=state, comm=comm, cmdline=cmdline if cmdline is not None else [comm],
                           starttime=pid if start is None else start, cgroup=cgroup or (SVC if unit else None),
                           unit=unit, unit_manager=manager if unit else None, num_threads=threads)


def table(*procs):
    t = dict((p.pid, p) for p in procs)
    t.setdefault(1, P(1, 0, "systemd", ["/sbin/init"]))
    for pid, ppid, comm in ((8998, 1, "ansible-playboo"), (8999, 8998, "python3"), (9000, 8999, "python3")):
        t.setdefault(pid, P(pid, ppid, comm, ["python3", "/root/.ansible/tmp/AnsiballZ_gpu_drain.py"], sid=8998,
                            pgid=8998))
    return t


def ctx(**kw):
    kw.setdefault("self_chain", ANSIBLE_CHAIN + (1,))
    kw.setdefault("exclude_res", gd.compile_patterns(gd.DEFAULT_EXCLUDE, "exclude"))
    return gd.PlanContext(**kw)


def H(pid, gpus=(0,), mib=1000, name=None):
    return {"pid": pid, "gpus": list(gpus), "used_mib": mib, "name": name}


def holders(*entries):
    return dict((e["pid"], e) for e in entries)


def reasons(plan):
    return dict((e["pid"], e["reason"]) for e in plan["skipped"])


# ---------------------------------------------------------------------------
# SGLang trees
# ---------------------------------------------------------------------------

def sglang_tree(main_sid, main_pgid, parent=1, unit=None):
    """python -m sglang.launch_server (2000) with two schedulers holding GPUs and a detokenizer."""
    return [
        P(2000, parent, "python3", ["python3", "-m", "sglang.launch_server", "--tp-size", "2", "--api-key", "k"],
          pgid=main_pgid, sid=main_sid, unit=unit),
        P(2001, 2000, "sglang::schedul", ["sglang::scheduler_TP0"], pgid=main_pgid, sid=main_sid, unit=unit),
        P(2002, 2000, "sglang::schedul", ["sglang::scheduler_TP1"], pgid=main_pgid, sid=main_sid, unit=unit),
        P(2003, 2000, "sglang::detoken", ["sglang::detokenizer"], pgid=main_pgid, sid=main_sid, unit=unit),
    ]


@pytest.mark.parametrize("how_started", ["setsid", "job-control"])
def test_sglang_tree_root_is_launch_server(how_started):
    if how_started == "setsid":
        procs = sglang_tree(main_sid=2000, main_pgid=2000)
    else:   # started from an interactive bash: its own process group, the shell's session
        procs = [P(1500, 1, "bash", ["-bash"], sid=1500)] + sglang_tree(main_sid=1500, main_pgid=2000, parent=1500)
    t = table(*procs)
    plan = gd.plan_drain(t, holders(H(2001, [0, 1]), H(2002, [2, 3])), ctx())
    assert plan["roots"] == [2000]
    assert plan["targets"][2000]["how"] == "process-group leader of holder 2001"
    assert plan["targets"][2001]["role"] == "holder" and plan["targets"][2001]["root"] == 2000
    assert plan["targets"][2003]["role"] == "descendant"
    assert 1500 not in plan["targets"] and 1 not in plan["targets"]
    assert plan["skipped"] == []


def test_choose_root_for_one_scheduler():
    t = table(*sglang_tree(main_sid=2000, main_pgid=2000))
    assert gd.choose_root(t, 2002, ctx()) == (2000, "process-group leader of holder 2002", [])


def test_sglang_under_systemd_root_is_main_pid():
    t = table(*sglang_tree(main_sid=2000, main_pgid=2000, unit="sglang-main.service"))
    plan = gd.plan_drain(t, holders(H(2001), H(2002)), ctx(unit_main_pids={"sglang-main.service": 2000}))
    assert plan["roots"] == [2000]
    assert plan["targets"][2000]["how"] == "main process of sglang-main.service (MainPID)"


def test_systemd_without_main_pid_uses_the_oldest_process_of_the_cgroup():
    procs = sglang_tree(main_sid=2000, main_pgid=2000, unit="sglang-main.service")
    procs[1].cgroup = SVC + "/payload"          # delegated sub-cgroup
    t = table(*procs)
    root, how, notes = gd.choose_root(t, 2001, ctx())
    assert (root, notes) == (2000, [])
    assert how == "main process of sglang-main.service (oldest process in its cgroup)"


def test_systemd_main_pid_that_is_a_shell_wrapper_falls_back_to_the_holder():
    # ExecStart=/bin/bash -c "python -m sglang.launch_server ...": bash is MainPID and leads the group.
    procs = [P(1900, 1, "bash", ["/bin/bash", "-c", "python -m sglang.launch_server"], unit="sglang-main.service")]
    procs += sglang_tree(main_sid=1900, main_pgid=1900, parent=1900, unit="sglang-main.service")
    t = table(*procs)
    root, how, notes = gd.choose_root(t, 2001, ctx(unit_main_pids={"sglang-main.service": 1900}))
    assert root == 2001 and how.startswith("holder itself")
    assert [n["pid"] for n in notes] == [1900, 1900]
    assert "shell, session or supervisor program (bash)" in notes[0]["reason"]
    plan = gd.plan_drain(t, holders(H(2001)), ctx(unit_main_pids={"sglang-main.service": 1900}))
    assert plan["roots"] == [2001]
    assert 1900 not in plan["targets"]
    assert "bash" in reasons(plan)[1900]


def test_systemd_main_pid_in_another_session_is_not_used():
    # A Jupyter kernel (own session) inside jupyterhub.service: stop the kernel, not the hub.
    t = table(P(3000, 1, "jupyterhub", ["python3", "/usr/bin/jupyterhub"], unit="jupyterhub.service"),
              P(3001, 3000, "python3", ["python3", "-m", "ipykernel_launcher"], unit="jupyterhub.service"))
    plan = gd.plan_drain(t, holders(H(3001)), ctx(unit_main_pids={"jupyterhub.service": 3000}))
    assert plan["roots"] == [3001]
    assert plan["targets"][3001]["how"] == "holder leads its own process group"
    assert "another session" in reasons(plan)[3000]


def test_user_manager_units_are_not_looked_up_as_system_services():
    t = table(P(4000, 1, "python3", ["python3", "serve.py"], unit="app.service", manager="user"),
              P(4001, 4000, "python3", ["python3", "worker"], pgid=4000, sid=4000, unit="app.service", manager="user"))
    root, how, notes = gd.choose_root(t, 4001, ctx(unit_main_pids={"app.service": 1}))
    assert root == 4000 and how == "process-group leader of holder 4001"


# ---------------------------------------------------------------------------
# Notebooks, sessions, orphans
# ---------------------------------------------------------------------------

def test_notebook_child_in_its_own_session_is_stopped_alone():
    t = table(P(5000, 1, "jupyter-lab", ["python3", "/usr/bin/jupyter-lab"]),
              P(5001, 5000, "python3", ["python3", "-m", "ipykernel_launcher"], pgid=5000, sid=5000),
              P(5002, 5001, "python3", ["python3", "train.py"]))          # setsid(): own session and group
    plan = gd.plan_drain(t, holders(H(5002)), ctx())
    assert plan["roots"] == [5002]
    assert set(plan["targets"]) == {5002}


def test_walk_never_crosses_a_session_boundary():
    # The holder's group leader (5000) sits above a session boundary: never chosen.
    t = table(P(5000, 1, "python3", ["python3", "agent.py"]),
              P(5001, 5000, "python3", ["python3", "runner.py"], pgid=5001, sid=5001),
              P(5002, 5001, "python3", ["python3", "gpu.py"], pgid=5000, sid=5001))
    root, how, notes = gd.choose_root(t, 5002, ctx())
    assert root == 5002
    assert "session boundary" in notes[0]["reason"]


def test_orphaned_scheduler_reparented_to_init_is_stopped_alone():
    # sglang#23627: the main process died, its scheduler was reparented to PID 1.
    t = table(P(2001, 1, "sglang::schedul", ["sglang::scheduler_TP0"], pgid=2000, sid=2000))
    plan = gd.plan_drain(t, holders(H(2001)), ctx())
    assert plan["roots"] == [2001]
    assert "not an ancestor" in reasons(plan)[2000] or "session boundary" in reasons(plan)[2000]
    assert 1 not in plan["targets"]


def test_holder_whose_group_is_led_by_init_falls_back_to_itself():
    t = table(P(6000, 1, "python3", ["python3", "x.py"], pgid=1, sid=0))
    t[1].sid = 0
    t[1].pgid = 1
    root, how, notes = gd.choose_root(t, 6000, ctx())
    assert root == 6000
    assert "init" in notes[0]["reason"]


@pytest.mark.parametrize("shell", ["bash", "sh", "zsh", "dash", "tmux: server", "screen", "sshd", "sudo",
                                   "su", "login", "conmon", "runc", "containerd-shim", "systemd"])
def test_shells_and_supervisors_are_never_roots(shell):
    # a script run without job control: the python holder is in the shell's group
    t = table(P(7000, 1, shell, [shell]),
              P(7001, 7000, "python3", ["python3", "-m", "sglang.launch_server"], pgid=7000, sid=7000))
    plan = gd.plan_drain(t, holders(H(7001)), ctx())
    assert plan["roots"] == [7001]
    assert 7000 not in plan["targets"]
    assert "supervisor" in reasons(plan)[7000]


def test_own_ancestors_are_never_roots():
    # The module runs inside the server's process group (e.g. from a notebook): never signal the chain.
    t = table(P(8000, 1, "python3", ["python3", "notebook.py"]),
              P(8001, 8000, "python3", ["python3", "gpu.py"], pgid=8000, sid=8000))
    plan = gd.plan_drain(t, holders(H(8001)), ctx(self_chain=ANSIBLE_CHAIN + (8000, 1)))
    assert plan["roots"] == [8001]
    assert "ancestors" in reasons(plan)[8000]


def test_ansible_processes_are_never_roots():
    t = table(P(8100, 1, "python3", ["/usr/bin/python3", "/usr/bin/ansible-playbook", "site.yml"]),
              P(8101, 8100, "python3", ["python3", "gpu.py"], pgid=8100, sid=8100))
    plan = gd.plan_drain(t, holders(H(8101)), ctx())
    assert plan["roots"] == [8101]
    assert "Ansible" in reasons(plan)[8100]


def test_excluded_leader_is_not_a_root_and_excluded_holder_is_not_signalled():
    t = table(P(9100, 1, "nv-hostengine", ["/usr/bin/nv-hostengine", "-n"]),
              P(9101, 9100, "dcgmproftester1", ["dcgmproftester12"], pgid=9100, sid=9100),
              P(9200, 1, "nvidia-cuda-mps", ["nvidia-cuda-mps-server"]))
    plan = gd.plan_drain(t, holders(H(9101), H(9200, [0, 1], 30)), ctx())
    assert plan["roots"] == [9101]
    r = reasons(plan)
    assert "excluded by 'nv-hostengine'" in r[9100]
    assert "excluded by 'nvidia-cuda-mps-server'" in r[9200]
    assert 9200 not in plan["targets"]


def test_exclude_matches_names_or_whole_command_lines():
    regexes = gd.compile_patterns(["dcgm", "python3", r".*my_job\.py.*", "nvidia-cuda-mps-server"], "exclude")
    assert gd.exclude_match(P(1, 0, "dcgm"), regexes) == "dcgm"
    assert gd.exclude_match(P(1, 0, "python3", ["/usr/bin/python3", "serve.py"]), regexes) == "python3"
    assert gd.exclude_match(P(1, 0, "python", ["python", "/opt/my_job.py", "-v"]), regexes) == r".*my_job\.py.*"
    # comm is cut to 15 characters; the executable's basename still matches
    assert gd.exclude_match(P(1, 0, "nvidia-cuda-mps", ["/usr/bin/nvidia-cuda-mps-server"]), regexes) \
        == "nvidia-cuda-mps-server"
    # a name is not a substring search: a user's job that mentions dcgm is not excluded
    assert gd.exclude_match(P(1, 0, "python", ["python", "train.py", "--log-dir", "/data/dcgm"]), regexes) is None
    assert gd.exclude_match(P(1, 0, "dcgmproftester1", ["dcgmproftester12"]), regexes) is None


def test_invalid_regex_names_the_option():
    with pytest.raises(ValueError, match="match: invalid regular expression '\\(unclosed'"):
        gd.compile_patterns(["(unclosed"], "match")


# ---------------------------------------------------------------------------
# Visibility, zombies, device files
# ---------------------------------------------------------------------------

def test_pid_from_another_namespace_is_never_signalled():
    t = table()
    plan = gd.plan_drain(t, holders(H(4194999, name=None), H(None)), ctx())
    assert plan["roots"] == [] and plan["targets"] == {}
    r = reasons(plan)
    assert "not visible in /proc" in r[4194999] and "host PID namespace" in r[4194999]
    assert "without a PID" in r[None]


def test_zombie_holder_is_not_signalled_but_a_zombie_leader_with_threads_is():
    t = table(P(7100, 1, "python3", state="Z"), P(7200, 1, "python3", state="Z", threads=3))
    plan = gd.plan_drain(t, holders(H(7100), H(7200)), ctx())
    assert "already exited" in reasons(plan)[7100]
    assert plan["roots"] == [7200]


def test_holder_without_gpu_device_open_is_not_signalled():
    t = table(P(7300, 1, "python3"), P(7400, 1, "python3"), P(7500, 1, "python3"))
    fds = {7300: [], 7400: ["/dev/nvidia0"], 7500: None}          # None: unreadable, unknown
    plan = gd.plan_drain(t, holders(H(7300), H(7400), H(7500)), ctx(device_fds=fds.get))
    assert plan["roots"] == [7400, 7500]
    assert "no GPU device file open" in reasons(plan)[7300]


# ---------------------------------------------------------------------------
# GPU subsets and trees
# ---------------------------------------------------------------------------

def test_root_holding_memory_only_outside_the_targets_is_refused():
    t = table(P(2100, 1, "python3", ["python3", "server.py"]),
              P(2101, 2100, "python3", ["python3", "worker"], pgid=2100, sid=2100))
    plan = gd.plan_drain(t, holders(H(2101, [0])), ctx(other_gpu_holders={2100: [4]}))
    assert plan["roots"] == [2101]
    assert "outside the targets (4)" in reasons(plan)[2100]


def test_tree_members_skip_other_sessions_and_other_gpu_holders():
    t = table(P(2200, 1, "python3", ["python3", "server.py"]),
              P(2201, 2200, "python3", ["python3", "rank0"], pgid=2200, sid=2200),
              P(2202, 2200, "python3", ["python3", "rank4"], pgid=2200, sid=2200),
              P(2203, 2200, "python3", ["python3", "helper"]),                       # setsid
              P(2204, 2203, "python3", ["python3", "helper-child"], pgid=2203, sid=2203),
              P(2205, 2200, "bash", ["sh", "-c", "logger"], pgid=2200, sid=2200))
    plan = gd.plan_drain(t, holders(H(2201, [0])), ctx(other_gpu_holders={2202: [4]}))
    assert plan["roots"] == [2200]
    assert set(plan["targets"]) == {2200, 2201, 2205}
    r = reasons(plan)
    assert "outside the targets" in r[2202]
    assert "another session" in r[2203] and "another session" in r[2204]


def test_two_servers_two_roots_in_order():
    t = table(*(sglang_tree(main_sid=2000, main_pgid=2000)
                + [P(3000, 1, "python3", ["python3", "-m", "sglang.launch_server", "--port", "30001"]),
                   P(3001, 3000, "sglang::schedul", ["sglang::scheduler_TP0"], pgid=3000, sid=3000)]))
    plan = gd.plan_drain(t, holders(H(3001, [4]), H(2001, [0]), H(2002, [1])), ctx())
    assert plan["roots"] == [2000, 3000]


# ---------------------------------------------------------------------------
# match and explicit pids
# ---------------------------------------------------------------------------

def test_match_narrows_by_holder_or_root_command_line():
    t = table(*(sglang_tree(main_sid=2000, main_pgid=2000)
                + [P(3000, 1, "python3", ["python3", "-m", "vllm.entrypoints.api_server"])]))
    plan = gd.plan_drain(t, holders(H(2001), H(3000)), ctx(match_res=gd.compile_patterns(["sglang\\.launch"], "match")))
    assert plan["roots"] == [2000]
    assert "match" in reasons(plan)[3000]
    # the retitled scheduler matches by its own title too
    plan = gd.plan_drain(t, holders(H(2001)), ctx(match_res=gd.compile_patterns(["scheduler_TP"], "match")))
    assert plan["roots"] == [2000]


def test_explicit_pids():
    t = table(*(sglang_tree(main_sid=2000, main_pgid=2000)
                + [P(4500, 1, "bash", ["bash"]), P(4600, 1, "python3", ["python3", "other.py"]),
                   P(4700, 1, "python3", state="Z")]))
    plan = gd.plan_drain(t, {}, ctx(match_res=gd.compile_patterns(["sglang"], "match")),
                         explicit_pids=[2000, 1, 9000, 4500, 4600, 4700, 123456])
    assert plan["roots"] == [2000]
    assert plan["targets"][2000]["how"] == "explicit in pids"
    # a recorded root holding no memory yet still takes its tree with it
    assert {2001, 2002, 2003} <= set(plan["targets"])
    r = reasons(plan)
    assert "init" in r[1]
    assert "ancestors" in r[9000]
    assert "supervisor" in r[4500]
    assert "does not match" in r[4600]
    assert "already exited" in r[4700]
    assert "not running" in r[123456]


def test_explicit_root_and_found_root_are_signalled_once():
    t = table(*sglang_tree(main_sid=2000, main_pgid=2000))
    plan = gd.plan_drain(t, holders(H(2001), H(2002)), ctx(), explicit_pids=[2000, 2000])
    assert plan["roots"] == [2000]
    assert plan["targets"][2000]["how"] == "explicit in pids"


def test_is_supervisor_and_ansible_detection():
    assert gd.is_supervisor(P(1, 0, "python3", ["-bash"])) == "bash"
    assert gd.is_supervisor(P(1, 0, "containerd-shim", ["/usr/bin/containerd-shim-runc-v2"])) == "containerd-shim"
    assert gd.is_supervisor(P(1, 0, "python3", ["python3", "-m", "sglang.launch_server"])) is None
    assert gd.is_ansible_process(P(1, 0, "python3", ["python3", "/tmp/x/AnsiballZ_command.py"]))
    assert gd.is_ansible_process(P(1, 0, "python3", ["/usr/bin/python3", "/usr/local/bin/ansible-runner", "run"]))
    assert not gd.is_ansible_process(P(1, 0, "python3", ["python3", "serve.py", "--ansible"]))


def test_holder_lines_for_diff():
    text = teardown.holder_lines([{"pid": 5, "name": "x", "gpus": [0, 1], "used_mib": None},
                                  {"pid": 4, "name": None, "gpus": [2], "used_mib": 10}])
    assert text == "PID 4 ? on GPU 2: 10 MiB\nPID 5 x on GPU 0,1: ?\n"
    assert teardown.holder_lines([]) == ""


# ---------------------------------------------------------------------------
# Holders that left the tree (issue 14 section 3): session, process group, cgroup
# ---------------------------------------------------------------------------

def test_reparented_scheduler_of_a_live_server_leads_to_the_server():
    # The scheduler's parent (a spawner process) died; it was reparented to PID 1 while the server runs.
    t = table(P(2000, 1, "python3", ["python3", "-m", "sglang.launch_server"]),
              P(2001, 1, "sglang::schedul", ["sglang::scheduler_TP0"], pgid=2000, sid=2000),
              P(2003, 1, "sglang::detoken", ["sglang::detokenizer"], pgid=2000, sid=2000),
              P(3000, 1, "python3", ["python3", "other.py"]))
    plan = gd.plan_drain(t, holders(H(2001)), ctx())
    assert plan["roots"] == [2000]
    assert plan["targets"][2000]["how"] == "process-group leader of holder 2001 (which left its tree)"
    assert plan["targets"][2001]["role"] == "holder" and plan["targets"][2001]["first"] is True
    # The detokenizer holds no GPU memory and is not a descendant: it is in the server's session all the same.
    assert plan["targets"][2003]["role"] == "member" and plan["targets"][2003]["first"] is True
    assert "session of root 2000" in plan["targets"][2003]["how"]
    assert 3000 not in plan["targets"] and 1 not in plan["targets"]


def test_members_of_a_dead_server_are_taken_with_its_holders():
    # The server (2000) was SIGKILLed before the redeploy: its schedulers and detokenizer live on under PID 1.
    t = table(P(2001, 1, "sglang::schedul", ["sglang::scheduler_TP0"], pgid=2000, sid=2000),
              P(2002, 1, "sglang::schedul", ["sglang::scheduler_TP1"], pgid=2000, sid=2000),
              P(2003, 1, "sglang::detoken", ["sglang::detokenizer"], pgid=2000, sid=2000),
              P(3000, 1, "python3", ["python3", "decoy.py"]))
    plan = gd.plan_drain(t, holders(H(2001, [0]), H(2002, [1])), ctx())
    assert plan["roots"] == [2001, 2002]
    member = plan["targets"][2003]
    assert member["role"] == "member" and member["first"] is True and member["gpus"] == []
    assert member["how"] == "in the process group of dead leader 2000, like holder 2001"
    assert 3000 not in plan["targets"]


def test_a_dead_login_shells_other_jobs_are_never_taken():
    # nohup'd from an ssh shell (session 1500, now dead): the server's job is group 2000; another job is group 2500.
    t = table(P(2001, 1, "sglang::schedul", ["sglang::scheduler_TP0"], pgid=2000, sid=1500),
              P(2003, 1, "sglang::detoken", ["sglang::detokenizer"], pgid=2000, sid=1500),
              P(2500, 1, "python3", ["python3", "train.py"], pgid=2500, sid=1500))
    plan = gd.plan_drain(t, holders(H(2001)), ctx())
    assert plan["roots"] == [2001]
    assert plan["targets"][2003]["role"] == "member"
    assert 2500 not in plan["targets"]


def test_cgroup_members_of_a_service_are_taken_and_shells_in_a_session_are_refused():
    t = table(*sglang_tree(main_sid=2000, main_pgid=2000, unit="sglang-main.service"))
    t[2010] = P(2010, 1, "python3", ["python3", "helper.py"], pgid=2010, sid=2010, unit="sglang-main.service")
    t[2011] = P(2011, 1, "sh", ["/bin/sh", "-c", "sleep 100"], pgid=2000, sid=2000)
    context = ctx(unit_main_pids={"sglang-main.service": 2000}, unit_cgroups={"sglang-main.service": SVC})
    plan = gd.plan_drain(t, holders(H(2001)), context)
    assert plan["roots"] == [2000]
    assert plan["targets"][2010]["role"] == "member" and "cgroup of sglang-main.service" in plan["targets"][2010]["how"]
    assert 2011 not in plan["targets"] and "shell" in reasons(plan)[2011]


def test_a_root_that_leads_neither_session_nor_group_has_no_members():
    # Started by a shell without job control: the shell's session and group are not the server's.
    t = table(P(1500, 1, "bash", ["-bash"], sid=1500, pgid=1500),
              P(2000, 1500, "python3", ["python3", "-m", "sglang.launch_server"], pgid=1500, sid=1500),
              P(2001, 2000, "sglang::schedul", ["sglang::scheduler_TP0"], pgid=1500, sid=1500),
              P(2600, 1, "vim", ["vim"], pgid=1500, sid=1500))
    plan = gd.plan_drain(t, holders(H(2001)), ctx())
    assert 2600 not in plan["targets"] and 1500 not in plan["targets"]


def test_unexpected_holders_against_expected_pids():
    t = table(*sglang_tree(main_sid=2000, main_pgid=2000))
    t[2101] = P(2101, 1, "sglang::schedul", ["sglang::scheduler_TP1"], pgid=2000, sid=2000)   # reparented
    t[5000] = P(5000, 1, "python3", ["python3", "-m", "sglang.launch_server", "--port", "31000"])
    plan = gd.plan_drain(t, holders(H(2001), H(2101, [1]), H(5000, [2])), ctx())
    assert gd.unexpected(plan, t, [2000]) == [5000]
    assert gd.unexpected(plan, t, []) == []
    assert gd.unexpected(plan, t, [2000, 5000]) == []
