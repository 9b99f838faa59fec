#!/usr/bin/env bash
# Headless Chromium for the admin browser tests: Debian's package (Playwright drives it; no browser download).
# Installs it when it is missing and this user may (root, or sudo without a password); else says what to do and
# exits 2. Used by `make test` and .ci/run.
set -uo pipefail
CHROMIUM="${REACH_CHROMIUM:-/usr/bin/chromium}"
[ -x "$CHROMIUM" ] && exit 0
if [ "$(id -u)" -eq 0 ]; then SUDO=""; elif sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
  echo "make test: $CHROMIUM is missing and this user may not install packages: run 'sudo apt-get install chromium' (or 'make test-fast' to skip the browser tests)" >&2
  exit 2
fi
command -v apt-get >/dev/null || { echo "make test: $CHROMIUM is missing and there is no apt-get: install Chromium, or set REACH_CHROMIUM to its path (or 'make test-fast')" >&2; exit 2; }
echo "installing chromium (Debian package) for the browser tests" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get install -y -q chromium >/dev/null 2>&1 || { $SUDO apt-get update -q >/dev/null && \
  $SUDO apt-get install -y -q chromium >/dev/null; } || { echo "make test: apt-get install chromium failed" >&2; exit 2; }
[ -x "$CHROMIUM" ] || { echo "make test: chromium installed but $CHROMIUM is missing" >&2; exit 2; }
