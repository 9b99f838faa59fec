"""`make test` on a fresh machine: .ci/chromium.sh passes when Chromium is there, and a user who may not install
packages gets one line saying what to do and a non-zero exit (the install itself runs in .ci/run as root)."""

from __future__ import annotations

import os
import subprocess

from tests.helpers import BASE

SCRIPT = BASE / ".ci" / "chromium.sh"


def test_present_chromium_needs_nothing():
    done = subprocess.run([str(SCRIPT)], env={**os.environ, "REACH_CHROMIUM": "/bin/sh"}, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0 and done.stderr == ""


def test_a_user_who_may_not_install_gets_one_line_and_exit_2():
    command = f"REACH_CHROMIUM=/nonexistent/chromium {SCRIPT}"
    # as root (CI, this machine kind) the script would install: run it as an unprivileged user instead
    argv = ["su", "-s", "/bin/bash", "nobody", "-c", command] if os.geteuid() == 0 else ["bash", "-c", command]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "may not install packages" in lines[0] and "make test-fast" in lines[0]
