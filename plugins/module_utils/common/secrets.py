# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpufleet maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The collection's one set of secret-masking rules (standard library only).

Every module, filter, report writer and simulator test masks through these
functions, so that a rule changed here changes everywhere:

* :func:`is_secret_name`: is a field, variable, flag or query-parameter name
  a secret (``api_key``, ``admin_api_key``, ``hf_token``, ``HF_TOKEN``,
  ``OPENAI_API_KEY``, ``ssl_keyfile_password``, ``--api-key``...)? Look-alikes
  such as ``speculative_num_draft_tokens``, ``speculative_token_map``,
  ``tokenizer_path`` and ``ssl_keyfile`` are not.
* :func:`mask_argv`: an argv list with the value after a secret flag
  (``--api-key X``), the value part of ``--api-key=X``, ``NAME=VALUE``
  environment words (``env HF_TOKEN=x python ...``), secrets inside URLs and
  the given literal secrets masked.
* :func:`mask_text`: the same inside free text (log lines, command lines
  joined with spaces, error messages), plus ``key='value'`` /
  ``"key": "value"`` assignments and ``Bearer`` tokens.
* :func:`mask_env`: an environment (dict or ``NAME=VALUE`` list).
* :func:`redact`: a deep copy of any JSON-like structure, with secret-named
  keys replaced and every string masked.

Masking is idempotent: masking a masked value changes nothing.
"""

from __future__ import annotations

import re

MASK = '********'

# The explicit secret flags of SGLang and the router. Any other flag whose
# name is secret by is_secret_name() is masked too; these stay listed so
# that the rule does not depend on the name heuristic for the known ones.
SECRET_FLAGS = ('--api-key', '--admin-api-key', '--hf-token')

# A name is secret when its last component is one of these, or when any
# component names a password or secret (ssl_keyfile_password, db_password,
# secret_path, client_secret_file).
_SECRET_LAST = frozenset(('key', 'apikey', 'token', 'secret', 'password', 'passwd', 'passphrase', 'credential',
                          'credentials', 'authorization'))
_SECRET_ANY = frozenset(('password', 'passwd', 'secret', 'apikey', 'credential', 'credentials', 'passphrase'))
# Names that end like a secret but name something else (tokenizer special
# tokens, lookup keys): keep the list short and exact.
_NOT_SECRET = frozenset(('pad_token', 'bos_token', 'eos_token', 'unk_token', 'sep_token', 'cls_token', 'mask_token',
                         'sort_key', 'cache_key', 'primary_key', 'routing_key'))
# Unquoted values that say "not set"; NAME=None is not a secret value.
_UNSET = frozenset(('None', 'none', 'null', 'NULL', 'False', 'false', 'True', 'true', '""', "''"))

# key = 'value' / "key": "value" / key="value" where the key looks secret.
_ASSIGN_RE = re.compile(
    r"""(?P<pre>(?P<q0>["']?)(?P<name>[A-Za-z0-9_.-]+)(?P=q0)\s*[:=]\s*)"""
    r"""(?P<q>["'])(?P<val>(?:(?!(?P=q)).)*)(?P=q)""",
)
# --flag VALUE / --flag=VALUE in free text; the name decides.
_FLAG_RE = re.compile(r'(?P<flag>--[A-Za-z0-9][A-Za-z0-9_-]*)(?P<sep>=|[ \t]+)(?P<val>[^\s"\']+)')
# "--api-key", "VALUE" inside a serialised argv list (JSON or a Python repr).
_QUOTED_FLAG_RE = re.compile(r'(?P<pre>(?P<q>["\'])(?P<flag>--[A-Za-z0-9][A-Za-z0-9_-]*)(?P=q)\s*,\s*(?P<q2>["\']))'
                             r'(?P<val>[^"\']*)(?P=q2)')
# NAME=VALUE words (environment strings); the name decides.
_ENV_RE = re.compile(r'(?P<pre>(?<![A-Za-z0-9_.-])(?P<name>[A-Za-z_][A-Za-z0-9_]*)=)(?P<val>[^\s"\'&;,)\]}]+)')
# scheme://user:password@host and scheme://token@host.
_URL_USERINFO_RE = re.compile(r'(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<info>[^/\s@?#]+)@')
# ?token=...&access_token=... (query and fragment parameters); the name decides.
_QUERY_RE = re.compile(r'(?P<pre>[?&#;](?P<name>[A-Za-z0-9_.-]+)=)(?P<val>[^&#\s"\']+)')
# "Bearer <token>" and "Authorization: <scheme> <token>" (HTTP headers in logs and errors).
_BEARER_RE = re.compile(r'(?P<pre>\bBearer\s+|\bAuthorization:\s*[A-Za-z]+\s+)(?P<val>[A-Za-z0-9._~+/=-]{4,})',
                        re.IGNORECASE)


def is_secret_name(name):
    """True when a field, variable, flag or parameter name denotes a secret."""
    text = str(name or '').strip().lstrip('-').lower()
    parts = [p for p in re.split(r'[^a-z0-9]+', text) if p]
    if not parts:
        return False
    if '_'.join(parts) in _NOT_SECRET:
        return False
    return parts[-1] in _SECRET_LAST or any(p in _SECRET_ANY for p in parts)


def _is_secret_flag(flag):
    return flag in SECRET_FLAGS or (flag.startswith('--') and is_secret_name(flag[2:]))


def _masked(value):
    return value == MASK or value.startswith(MASK)


def _mask_literals(text, secrets):
    for secret in sorted(set(str(s) for s in secrets if s not in (None, '') and len(str(s)) >= 1), key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def _mask_urls(text):
    def _userinfo(match):
        info = match.group('info')
        if info == MASK:
            return match.group(0)
        user, sep, dummy = info.partition(':')
        if sep:
            return '%s%s:%s@' % (match.group('scheme'), user, MASK)
        return '%s%s@' % (match.group('scheme'), MASK)

    text = _URL_USERINFO_RE.sub(_userinfo, text)

    def _query(match):
        if not is_secret_name(match.group('name')) or _masked(match.group('val')):
            return match.group(0)
        return match.group('pre') + MASK

    return _QUERY_RE.sub(_query, text)


def mask_text(text, secrets=()):
    """Mask secret values in free text; None stays None.

    Covers the literal values in ``secrets``, ``key='value'`` and
    ``"key": "value"`` assignments with a secret key (the ``server_args=``
    line SGLang logs, JSON), ``--api-key VALUE`` and ``--api-key=VALUE``,
    ``HF_TOKEN=VALUE`` words, URL user information and secret query
    parameters, and ``Bearer`` tokens.
    """
    if text is None:
        return None
    out = _mask_literals(str(text), secrets)
    out = _mask_urls(out)

    def _assign(match):
        if not is_secret_name(match.group('name')) or match.group('val') in ('', MASK):
            return match.group(0)
        return '%s%s%s%s' % (match.group('pre'), match.group('q'), MASK, match.group('q'))

    out = _ASSIGN_RE.sub(_assign, out)

    def _flag(match):
        val = match.group('val')
        if not _is_secret_flag(match.group('flag')) or _masked(val) or (match.group('sep') != '=' and val.startswith('--')):
            return match.group(0)
        return '%s%s%s' % (match.group('flag'), match.group('sep'), MASK)

    out = _FLAG_RE.sub(_flag, out)

    def _quoted_flag(match):
        if not _is_secret_flag(match.group('flag')) or match.group('val') in ('', MASK):
            return match.group(0)
        return '%s%s%s' % (match.group('pre'), MASK, match.group('q2'))

    out = _QUOTED_FLAG_RE.sub(_quoted_flag, out)

    def _env(match):
        val = match.group('val')
        if not is_secret_name(match.group('name')) or _masked(val) or val in _UNSET:
            return match.group(0)
        return match.group('pre') + MASK

    out = _ENV_RE.sub(_env, out)

    def _bearer(match):
        return match.group(0) if _masked(match.group('val')) else match.group('pre') + MASK

    return _BEARER_RE.sub(_bearer, out)


def mask_argv(argv, secrets=()):
    """Copy of ``argv`` (a list of words) with every secret masked.

    ``--flag VALUE`` masks the next word when the flag is secret (a flag at
    the very end masks nothing); ``--flag=VALUE`` masks the value part; every
    word also goes through :func:`mask_text` (``HF_TOKEN=x``, URLs, literals).
    """
    words = [str(w) for w in argv]
    out = []
    mask_next = False
    for word in words:
        if mask_next:
            mask_next = False
            if not word.startswith('--') or word == MASK:
                out.append(MASK)
                continue
        flag, sep, dummy = word.partition('=')
        if _is_secret_flag(flag):
            if sep:
                out.append(flag + '=' + MASK)
            else:
                out.append(word)
                mask_next = True
            continue
        out.append(mask_text(word, secrets))
    return out


def mask_cmdline(argv, secrets=()):
    """``argv`` joined with spaces, secrets masked (for reports and messages)."""
    return ' '.join(mask_argv(argv, secrets))


def mask_env(env, secrets=()):
    """A masked copy of an environment: a dict, or a list of ``NAME=VALUE`` strings."""
    if isinstance(env, dict):
        return dict((k, MASK if is_secret_name(k) and v not in (None, '') else mask_text(v, secrets) if isinstance(v, str) else v)
                    for k, v in env.items())
    out = []
    for item in env or ():
        name, sep, value = str(item).partition('=')
        if sep and is_secret_name(name) and value:
            out.append(name + '=' + MASK)
        else:
            out.append(mask_text(item, secrets))
    return out


def _argv_like(items):
    return any(isinstance(v, str) for v in items) and not any(isinstance(v, (dict, list, tuple)) for v in items)


def redact(obj, secrets=()):
    """Deep copy of ``obj`` with secret-named keys set to ``********`` (when they
    hold a value) and every string masked; lists of words are masked as argv."""
    if isinstance(obj, dict):
        res = {}
        for key, value in obj.items():
            if is_secret_name(key) and value not in (None, '', False):
                res[key] = MASK
            else:
                res[key] = redact(value, secrets)
        return res
    if isinstance(obj, (list, tuple)):
        if _argv_like(obj):
            masked = mask_argv([str(v) for v in obj], secrets)
            return [m if isinstance(v, str) or m != str(v) else v for v, m in zip(obj, masked)]
        return [redact(v, secrets) for v in obj]
    if isinstance(obj, str):
        return mask_text(obj, secrets)
    return obj
