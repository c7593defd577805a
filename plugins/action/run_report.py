# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller-side writer of the redeploy report (documented in plugins/modules/run_report.py).

It runs in the controller's worker process and executes no module: writing the report used to
take five module runs (file, copy = stat + copy, template = stat + copy) per batch, which on a
rolling redeploy (serial 1) was five module runs per host.
"""

from __future__ import annotations

import json
import os

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.text.converters import to_text
from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.sglang.plugins.module_utils.node.supervise import write_private

DIR_MODE = 0o750
FILE_MODE = 0o640

TABLE_HEAD = (
    "| host | status | step | spec (algo / steps / topk / draft) | startup s | smoke tok/s | accept len "
    "| signalled PIDs | rollback |"
)
TABLE_RULE = "|---|---|---|---|---|---|---|---|---|"
SPEC_KEYS = ("speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")


def _text(value):
    return to_text(value, errors="surrogate_or_strict")


def _or_dash(value):
    return "-" if value is None else _text(value)


def _gpus(readings):
    return ", ".join("%s=%s MiB" % (_text(g.get("index")), _text(g.get("used_mib"))) for g in readings) or "-"


def _would_signal(row):
    """A check-mode row's teardown: the PIDs a real run would signal, with what the preflight found them to be."""
    holders = dict((h.get("pid"), h) for h in row.get("holders") or [] if isinstance(h, dict))
    pids = row.get("planned_teardown") or []
    if not pids:
        return ["- Signalled: none (check mode; a real run would signal nothing)"]
    out = ["- Signalled: none (check mode); a real run would signal:"]
    for pid in pids:
        holder = holders.get(pid) or {}
        what = ", ".join(_text(x) for x in (holder.get("class"), holder.get("cmdline")) if x)
        out.append("  - would signal PID %s%s" % (_text(pid), (" (%s)" % what[:200]) if what else ""))
    return out


def _plan_and_lease(row):
    """The plan (its action and why), the config it replaced and the lease waits, when the row has them."""
    out = []
    if row.get("plan_why"):
        out.append("- Plan: %s: %s" % (_text(row.get("plan")), _text(row["plan_why"])))
    previous = row.get("previous_args")
    if isinstance(previous, dict) and previous:
        out.append("- Previous config: %s" % ", ".join("%s=%s" % (_text(k), _text(previous[k])) for k in sorted(previous)))
    lease = row.get("lease") or {}
    if lease.get("waited_s") or lease.get("waited_for") or lease.get("took_over"):
        text = "waited %s s" % _text(lease.get("waited_s") or 0)
        if lease.get("waited_for"):
            text += " for %s" % _text(lease["waited_for"])
        if lease.get("took_over"):
            text += "; took over the lease of %s (%s)" % (_text(lease["took_over"]), _text(lease.get("took_over_reason") or "?"))
        out.append("- Lease: %s" % text)
    return out


def render_markdown(title, rows):
    """The Markdown report of ``rows`` (the format of docs/report.md)."""
    out = ["# SGLang redeploy report %s" % _text(title), "", TABLE_HEAD, TABLE_RULE]
    for r in rows:
        args = r.get("effective_args") or {}
        smoke = r.get("smoke") or {}
        out.append("| %s |" % " | ".join([
            _text(r.get("host")), _text(r.get("status")), _text(r.get("step")),
            " / ".join(_text(args.get(k, "-")) for k in SPEC_KEYS),
            _or_dash(r.get("startup_s")), _or_dash(smoke.get("tokens_per_s")), _or_dash(smoke.get("accept_length")),
            ", ".join(_text(p.get("pid")) for p in r.get("signalled") or []) or "-",
            _text((r.get("rollback") or {}).get("status")),
        ]))
    out.append("")
    for r in rows:
        rollback = r.get("rollback") or {}
        out += ["## %s: %s" % (_text(r.get("host")), _text(r.get("status"))), ""]
        if r.get("error"):
            out.append("- Error: %s" % _text(r["error"]))
        if rollback.get("detail"):
            out.append("- Rollback: %s: %s" % (_text(rollback.get("status")), _text(rollback["detail"])))
        out += _plan_and_lease(r)
        out.append("- Adjustments:")
        out += ["  - `%s`: %s -> %s (%s, %s)" % tuple(_text(a.get(k)) for k in ("arg", "from", "to", "rule", "doc"))
                for a in r.get("adjustments") or []] or ["  - none"]
        out.append("- GPUs before: %s" % _gpus(r.get("gpus_before") or []))
        out.append("- GPUs after: %s" % _gpus(r.get("gpus_after") or []))
        if r.get("status") == "planned":
            # Check mode: nothing was signalled; say what a real run's teardown would signal.
            out += _would_signal(r)
        else:
            out.append("- Signalled:")
            out += ["  - PID %s (%s): %s" % (_text(p.get("pid")), _text(p.get("name", "?")),
                                             ", ".join(_text(s) for s in p.get("signals") or [])
                                             or "exited with its server, not signalled directly")
                    for p in r.get("signalled") or []] or ["  - none"]
        image = r.get("image") or {}
        if image:
            out.append("- Image: before %s; after %s" % (_image_words(image.get("before")), _image_words(image.get("after"))))
        for c in r.get("containers_stopped") or []:
            out.append("- Stopped through its runtime: %s container %s (id %s, image %s, restart policy %s%s)" % tuple(
                _text(x) for x in (c.get("runtime"), c.get("name"), (c.get("id") or "")[:12], c.get("image"),
                                   c.get("restart_policy"), ", turned off" if c.get("restart_policy_set") else "")))
        if r.get("exited"):
            out.append("- Exited with their server (not signalled): %s" % ", ".join(
                "PID %s (%s)" % (_text(p.get("pid")), _text(p.get("name") or "?")) for p in r["exited"]))
        for path in r.get("details_files") or []:
            out.append("- Full module result on the node: `%s`" % _text(path))
        out.append("")
    return "\n".join(out) + "\n"


def _image_words(image):
    """``ref`` with its digest (or image ID), for the report."""
    if not image:
        return "none (a host process)"
    ref = _text(image.get("ref") or "?")
    if image.get("digest"):
        return "%s (digest %s)" % (ref, _text(str(image["digest"]).rsplit("@", maxsplit=1)[-1]))
    return "%s (image %s)" % (ref, _text(str(image.get("id") or "?").replace("sha256:", "")[:12]))


def merge_rows(existing, new):
    """``existing`` without the hosts of ``new``, then ``new``: a host's row is replaced, never lost."""
    hosts = {r.get("host") for r in new}
    return [r for r in existing if not (isinstance(r, dict) and r.get("host") in hosts)] + list(new)


def read_rows(path):
    """The rows of the JSON report at ``path``: [] when there is none yet; a clear error when it is not a report."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise AnsibleActionFail("The report %s cannot be read (%s); move it away or choose another sglang_report_dir" % (path, exc))
    if not isinstance(data, list):
        raise AnsibleActionFail("The report %s is not a JSON list of hosts; move it away or choose another sglang_report_dir" % path)
    return data


def write_report(base, title, rows):
    """Merge ``rows`` into ``<base>.json`` and write ``<base>.md``; return ``(json_path, md_path, all_rows)``."""
    base = os.path.expanduser(base)
    parent = os.path.dirname(base)
    if parent:
        os.makedirs(parent, DIR_MODE, exist_ok=True)
    json_path, md_path = base + ".json", base + ".md"
    merged = merge_rows(read_rows(json_path), rows)
    # Atomic (a temporary file in the same directory, then a rename), created with the final mode.
    write_private(json_path, json.dumps(merged, indent=2, sort_keys=True, default=_text) + "\n", mode=FILE_MODE)
    write_private(md_path, render_markdown(title, merged), mode=FILE_MODE)
    return json_path, md_path, merged


class ActionModule(ActionBase):

    TRANSFERS_FILES = False
    _supports_check_mode = True
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        super().run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(argument_spec=dict(
            path=dict(type="str", required=True),
            rows=dict(type="list", elements="dict", required=True),
            title=dict(type="str", default=""),
            on_error=dict(type="str", default="fail", choices=["fail", "warn"]),
        ))
        bad = [i for i, r in enumerate(args["rows"]) if not r.get("host")]
        if bad:
            raise AnsibleActionFail("rows[%s] has no host; every row names the inventory host it reports" % ", ".join(map(str, bad)))
        try:
            json_path, md_path, merged = write_report(args["path"], args["title"], args["rows"])
        except (OSError, AnsibleActionFail) as exc:
            msg = ("Cannot write the report under %s: %s; fix sglang_report_dir or its permissions"
                   % (os.path.dirname(os.path.expanduser(args["path"])) or ".", getattr(exc, "message", exc)))
            if args["on_error"] == "warn":
                # The report is the record of what happened; it must never hide the outcome of the run itself.
                return dict(changed=False, failed=False, report_error=msg, json_path=None, markdown_path=None, hosts=[],
                            warnings=[msg])
            raise AnsibleActionFail(msg)
        # The report is the controller's record of the run, not a change to a host.
        return dict(changed=False, json_path=json_path, markdown_path=md_path, hosts=[r.get("host") for r in merged])
