#!/usr/bin/env bash
# Debian's chromium and its matching chromedriver for the dashboard's browser tests (installed when missing).
# Prints nothing on success; Selenium is pointed at /usr/bin/chromium and /usr/bin/chromedriver, never downloads.
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "chromium/chromedriver missing and not root: apt-get install chromium chromium-driver" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq chromium chromium-driver >&2
