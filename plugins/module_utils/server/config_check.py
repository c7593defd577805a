# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The effective-config check of a healthy server: what it runs (``/server_info``) against what was intended."""

from __future__ import annotations

from ansible_collections.gpufleet.sglang.plugins.module_utils.common import http
from ansible_collections.gpufleet.sglang.plugins.module_utils.common import secrets as secret_rules
from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import compare
from ansible_collections.gpufleet.sglang.plugins.module_utils.server.health_gate import PROBE_TIMEOUT
from ansible_collections.gpufleet.sglang.plugins.module_utils.server.launch_params import LaunchError


class ConfigCheck(object):
    """The effective-config methods of :class:`launcher.Launcher`."""

    def server_info(self):
        order = ["/server_info", "/get_server_info"]
        if not compare.supports_config(self.version):
            order.reverse()
        last = None
        for path in order:
            try:
                status, _h, body = http.request("GET", self.url + path, api_key=self.api_key, timeout=PROBE_TIMEOUT)
            except http.HTTPConnectionError as exc:
                raise LaunchError("the server is healthy but %s%s could not be read: %s" % (self.url, path, exc))
            if status == 404:
                last = "%s: HTTP 404" % path
                continue
            if status in (401, 403):
                raise LaunchError("%s%s answered HTTP %d: the server wants an API key%s" % (
                    self.url, path, status, " other than the one given" if self.api_key else "; set api_key"))
            if status != 200 or not isinstance(body, dict):
                raise LaunchError("%s%s answered HTTP %d with %s" % (self.url, path, status, type(body).__name__))
            return path, body
        raise LaunchError("the server answers neither /server_info nor /get_server_info (%s)" % last)

    def verify(self, log_offset, since_wall):
        res = self.result
        endpoint, info = self.server_info()
        res["server_info_endpoint"] = endpoint
        res["version"] = info.get("version")
        res["effective"] = secret_rules.redact(info, self.secrets)
        expect = self.p["expect"]
        if expect is None:
            expect = self.args
        # What the server runs, for every field that was predicted (the report's effective_args).
        res["effective_args"] = secret_rules.redact(dict(
            (k, compare.lookup_effective(info, k)[1]) for k in sorted(expect or {}) if compare.lookup_effective(info, k)[0]),
            self.secrets)
        overrides, unverified = compare.compare(expect, info, self.version, args=self.args,
                                                adjustments=self.p["adjustments"] or [])
        for item in overrides:
            item["intended"] = secret_rules.redact(item["intended"], self.secrets)
            item["running"] = secret_rules.redact(item["running"], self.secrets)
        res["overrides"] = overrides
        res["unverified"] = unverified
        res["log_warnings"] = compare.scan_log(self.log_text(log_offset, since_wall), self.version, self.secrets)
        if not overrides:
            return
        lines = [compare.format_override(item) for item in overrides]
        policy = self.p["on_override"]
        if policy == "warn":
            for line in lines:
                self.ctx.warn("SGLang server %s: %s" % (self.name, line))
        elif policy == "fail":
            warn_lines = ["  log: %s" % w["line"] for w in res["log_warnings"]]
            raise LaunchError(
                "SGLang server %s is healthy but does not run the intended configuration (%d difference%s). The server was left "
                "running (pid %s) so the playbook can roll back; set on_override=warn to accept it.\n- %s%s"
                % (self.name, len(lines), "" if len(lines) == 1 else "s", res.get("pid"), "\n- ".join(lines),
                   ("\nSGLang logged:\n" + "\n".join(warn_lines)) if warn_lines else ""), config_mismatch=True)
