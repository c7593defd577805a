"""Mask host-identifying data in captured nvidia-smi output (standard library only).

What is masked, and why (see tests/gpu/README.md, "Masking"):

* **Host names**: ``socket.gethostname()``, ``socket.getfqdn()``, the short
  name before the first dot, and ``/etc/hostname``; each is replaced by
  ``masked-host`` wherever it appears as a whole word.
* **The caller's home directory** (process names are absolute paths of
  executables, e.g. ``/home/alice/venv/bin/python3``) becomes
  ``/home/masked-user``; ``/root`` is not masked (it identifies nothing).
* **Serial numbers**: any stand-alone run of 12 to 16 digits (board serials
  are 13 digits, e.g. ``1654922001234``; no value of the queries the collection
  makes has that many digits) becomes a fake of the same length, ``9`` followed
  by a zero-padded counter.
* **GPU and MIG UUIDs**: they identify a physical chip as precisely as a
  serial, so they are masked too, **consistently**: one :class:`Masker`
  maps the same UUID to the same fake UUID in every capture of a run
  (first seen gets ``...000000000000``, the next ``...000000000001``), so the
  cross-references between queries (``gpu_uuid`` in ``--query-compute-apps``
  versus ``uuid`` in ``--query-gpu`` and ``-L``) still hold.  Fakes keep the
  ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`` shape (lower-case hex) and all
  start with ``6d61736b`` (``"mask"`` in ASCII hex), so a masked UUID is
  recognisable and masking is idempotent.  The mapping is never written
  anywhere.

Not masked: PCI bus ids (the same on every board of a model; the collection
selects GPUs by them), PIDs, product names, memory figures, driver versions.

Command line: ``python3 tests/gpu/mask.py [--check] [FILE ...]`` masks the
files (or stdin) to stdout; ``--check`` instead lists leaks and exits 1 if any.
"""
from __future__ import annotations

import os
import re
import socket
import sys

FAKE_UUID_PREFIX = "6d61736b"          # "mask"
MASKED_HOST = "masked-host"
MASKED_HOME = "/home/masked-user"
SERIAL_FAKE_LEAD = "9"

UUID_RE = re.compile(r"\b(GPU|MIG)-([0-9a-fA-F]{8})-([0-9a-fA-F]{4})-([0-9a-fA-F]{4})-([0-9a-fA-F]{4})-([0-9a-fA-F]{12})\b")
SERIAL_RE = re.compile(r"(?<![\w.:/-])(\d{12,16})(?![\w.:/-])")
# Host names that identify nothing and would only mangle text if replaced.
TRIVIAL_HOSTS = frozenset(("", "localhost", "localhost.localdomain", "localdomain", "(none)", "ip6-localhost"))
_NON_IDENTIFYING_HOMES = frozenset(("", "/", "/root"))


def local_hostnames():
    """The names of this machine: hostname, FQDN, short name, /etc/hostname."""
    names = set()
    for getter in (socket.gethostname, socket.getfqdn):
        try:
            names.add(getter())
        except OSError:
            pass
    try:
        with open("/etc/hostname", "r", encoding="utf-8") as fh:
            names.add(fh.read().strip())
    except OSError:
        pass
    for name in list(names):
        if name and "." in name:
            names.add(name.split(".", 1)[0])
    return sorted((n for n in names if n and n.lower() not in TRIVIAL_HOSTS), key=lambda n: (-len(n), n))


def local_homes():
    home = os.path.expanduser("~")
    return [] if home.rstrip("/") in _NON_IDENTIFYING_HOMES or home == "~" else [home.rstrip("/")]


def is_fake_uuid(text):
    match = UUID_RE.fullmatch(text.strip())
    return bool(match) and match.group(2).lower() == FAKE_UUID_PREFIX


def is_fake_serial(value):
    """True for the fakes :class:`Masker` makes: ``9``, zeros, a small counter."""
    return len(value) >= 12 and value.isdigit() and value.startswith(SERIAL_FAKE_LEAD) and int(value[1:]) < 10000


class Masker(object):
    """Consistent masking across the captures of one run.

    ``hostnames`` and ``homes`` default to this machine's; pass them
    explicitly in tests.  ``terms`` are extra words to replace by
    ``masked``.
    """

    def __init__(self, hostnames=None, homes=None, terms=()):
        self.hostnames = [h for h in (local_hostnames() if hostnames is None else hostnames)
                          if h and h.lower() not in TRIVIAL_HOSTS]
        self.hostnames.sort(key=lambda n: (-len(n), n))
        self.homes = [h.rstrip("/") for h in (local_homes() if homes is None else homes)
                      if h.rstrip("/") not in _NON_IDENTIFYING_HOMES]
        self.terms = [t for t in terms if t]
        self._uuids = {}     # real (lower case, without prefix) -> fake hex body
        self._serials = {}   # real -> fake
        self._host_res = [re.compile(r"(?<![\w-])%s(?![\w-])" % re.escape(h), re.IGNORECASE) for h in self.hostnames]

    # -- pieces -----------------------------------------------------------
    def fake_uuid_body(self, body):
        """Fake for the 32-hex-digit ``body`` of a UUID (dashes removed, lower case)."""
        body = body.lower()
        if body.startswith(FAKE_UUID_PREFIX):
            return body
        fake = self._uuids.get(body)
        if fake is None:
            fake = FAKE_UUID_PREFIX + "%024x" % len(self._uuids)
            self._uuids[body] = fake
        return fake

    def _uuid_sub(self, match):
        body = "".join(match.groups()[1:])
        fake = self.fake_uuid_body(body)
        return "%s-%s-%s-%s-%s-%s" % (match.group(1), fake[0:8], fake[8:12], fake[12:16], fake[16:20], fake[20:32])

    def _serial_sub(self, match):
        real = match.group(1)
        if is_fake_serial(real):
            return real
        fake = self._serials.get(real)
        if fake is None:
            counter = str(len(self._serials) + 1)
            fake = SERIAL_FAKE_LEAD + counter.rjust(len(real) - 1, "0")
            self._serials[real] = fake
        return fake

    # -- public -----------------------------------------------------------
    def mask(self, text):
        """Masked copy of ``text`` (str); the shape of every value is kept."""
        if not text:
            return text
        out = UUID_RE.sub(self._uuid_sub, text)
        out = SERIAL_RE.sub(self._serial_sub, out)
        for home in self.homes:
            out = out.replace(home + "/", MASKED_HOME + "/")
            out = re.sub(r"%s(?![\w.-])" % re.escape(home), MASKED_HOME, out)
        for rx in self._host_res:
            out = rx.sub(MASKED_HOST, out)
        for term in self.terms:
            out = out.replace(term, "masked")
        return out

    def mask_obj(self, obj):
        """Mask every string inside a JSON-like structure (dict keys too)."""
        if isinstance(obj, str):
            return self.mask(obj)
        if isinstance(obj, list):
            return [self.mask_obj(v) for v in obj]
        if isinstance(obj, tuple):
            return tuple(self.mask_obj(v) for v in obj)
        if isinstance(obj, dict):
            return {self.mask_obj(k): self.mask_obj(v) for k, v in obj.items()}
        return obj

    def leaks(self, text):
        """What in ``text`` still identifies the host: a list of ``'kind: value'``."""
        found = []
        for match in UUID_RE.finditer(text or ""):
            if match.group(2).lower() != FAKE_UUID_PREFIX:
                found.append("uuid: %s" % match.group(0))
        for match in SERIAL_RE.finditer(text or ""):
            value = match.group(1)
            if not is_fake_serial(value):
                found.append("serial: %s" % value)
        for host, rx in zip(self.hostnames, self._host_res):
            if rx.search(text or ""):
                found.append("hostname: %s" % host)
        for home in self.homes:
            if re.search(r"%s(?![\w.-])" % re.escape(home), text or "") or (home + "/") in (text or ""):
                found.append("home: %s" % home)
        for term in self.terms:
            if term in (text or ""):
                found.append("term: %s" % term)
        return found

    @property
    def uuid_count(self):
        return len(self._uuids)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    check = False
    if argv and argv[0] in ("-h", "--help"):
        sys.stdout.write(__doc__)
        return 0
    if argv and argv[0] == "--check":
        check = True
        argv = argv[1:]
    masker = Masker()
    texts = []
    if not argv:
        texts.append(("<stdin>", sys.stdin.read()))
    for path in argv:
        with open(path, "r", encoding="utf-8", errors="replace") as fh:
            texts.append((path, fh.read()))
    rc = 0
    for name, text in texts:
        if check:
            for leak in masker.leaks(text):
                sys.stdout.write("%s: %s\n" % (name, leak))
                rc = 1
        else:
            sys.stdout.write(masker.mask(text))
    return rc


if __name__ == "__main__":
    sys.exit(main())
