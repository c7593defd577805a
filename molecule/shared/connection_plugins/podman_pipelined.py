# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""containers.podman.podman with pipelining, for the molecule container hosts.

containers.podman.podman runs ``podman exec`` without ``--interactive``, so
the module cannot come in on stdin and pipelining is off: every module run
costs a ``podman mount``, a ``mkdir`` of a temporary directory, a ``chmod``
and the run itself, each one ``podman exec`` (seconds apiece on a loaded
2-core machine). This subclass passes ``--interactive`` when there is input
and mounts nothing up front (files go through ``podman cp``), so a module
run is one ``podman exec``. Everything else is the parent plugin.

Used by the scenarios through ANSIBLE_CONNECTION_PLUGINS and
``ansible_connection: podman_pipelined`` in their host_vars, with
``pipelining = True`` in the provisioner's config_options.
"""

from __future__ import annotations

import shlex

from ansible.module_utils.common.text.converters import to_native
from ansible.plugins.connection import ConnectionBase, ensure_connect
from ansible_collections.containers.podman.plugins.connection.podman import Connection as PodmanConnection

DOCUMENTATION = """
    name: podman_pipelined
    short_description: containers.podman.podman with pipelining (molecule test hosts)
    description:
        - Run commands or put/fetch files to an existing container using podman, with pipelining.
    author: gpufleet maintainers (@gpufleet)
    options:
      remote_addr:
        description:
          - The ID of the container you want to access.
        default: inventory_hostname
        vars:
          - name: ansible_host
          - name: inventory_hostname
          - name: ansible_podman_host
      remote_user:
        description:
          - User specified via name or UID which is used to execute commands inside the container.
        ini:
          - section: defaults
            key: remote_user
        env:
          - name: ANSIBLE_REMOTE_USER
        vars:
          - name: ansible_user
      podman_extra_args:
        description:
          - Extra arguments to pass to the podman command line.
        default: ''
        ini:
          - section: defaults
            key: podman_extra_args
        vars:
          - name: ansible_podman_extra_args
        env:
          - name: ANSIBLE_PODMAN_EXTRA_ARGS
      podman_executable:
        description:
          - Executable for podman command.
        default: podman
        vars:
          - name: ansible_podman_executable
        env:
          - name: ANSIBLE_PODMAN_EXECUTABLE
"""


class Connection(PodmanConnection):
    """podman exec --interactive: pipelining works, one exec per module run."""

    transport = "podman_pipelined"
    has_pipelining = True

    def _connect(self):
        # No `podman mount` per task: put_file/fetch_file use `podman cp`
        # when no mount point is known.
        ConnectionBase._connect(self)  # pylint: disable=protected-access  # skip the parent's mount
        self._connected = True
        return self

    @ensure_connect
    def exec_command(self, cmd, in_data=None, sudoable=False):
        ConnectionBase.exec_command(self, cmd, in_data=in_data, sudoable=sudoable)
        exec_args = ["exec"]
        if in_data is not None:
            exec_args.append("--interactive")
        if self.user:
            exec_args.extend(("--user", self.user))
        return self._podman(exec_args, shlex.split(to_native(cmd, errors="surrogate_or_strict")), in_data)
