"""Offline stand-in for ansible-test's pip bootstrap script (get-pip.py).

ansible-test downloads get-pip.py from a host that is not reachable here
(docs/development.md, "ansible-test sanity offline"). This script does the
same job with the standard library: it runs pip straight from the wheel that
ensurepip bundles (as get-pip.py runs pip from its embedded copy, so a venv
whose pip was stripped by an earlier sanity run is repaired too) and installs
the pinned pip version, plus whatever else ansible-test asks for, from the
package index that pip is configured to use.

ansible-test runs it as: python get_pip.py [pip options] [pkg==ver ...]
"""
import glob
import os
import subprocess
import sys

import ensurepip

args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
bundled = glob.glob(os.path.join(os.path.dirname(ensurepip.__file__), "_bundled", "pip-*.whl"))
# Debian's Python takes ensurepip's wheels from python3-pip-whl (the controller legs' trixie image).
bundled += glob.glob("/usr/share/python-wheels/pip-*.whl")
if not bundled:
    sys.exit("get_pip_offline: ensurepip has no bundled pip wheel")
env = dict(os.environ, PYTHONPATH=bundled[0])
subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet", "--force-reinstall"] + args, env=env)
