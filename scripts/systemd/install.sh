#!/bin/sh
# Install inferpool as a systemd service:
#   - a system user and group "inferpool" (clients join the group to use the ipc socket);
#   - a virtual environment in PREFIX (default /opt/inferpool) with inferpool installed;
#   - /etc/systemd/system/inferpool.service (PREFIX substituted) and, unless it exists,
#     /etc/inferpool/inferpool.env;
#   - systemctl daemon-reload, then enable --now unless --no-start.
#
# Usage: sudo scripts/systemd/install.sh [--prefix DIR] [--no-start]
# With DESTDIR=<dir> the files are staged under <dir> and the user, the virtual
# environment and systemctl are skipped (for packaging, and for the test suite).
set -eu

PREFIX=/opt/inferpool
START=yes
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) PREFIX=$2; shift 2 ;;
        --no-start) START=no; shift ;;
        *) echo "install.sh: unknown argument '$1' (use --prefix DIR, --no-start)" >&2; exit 2 ;;
    esac
done
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$HERE/../.." && pwd)
DESTDIR=${DESTDIR:-}

if [ -z "$DESTDIR" ]; then
    [ "$(id -u)" = 0 ] || { echo "install.sh: run as root (or set DESTDIR to stage)" >&2; exit 1; }
    command -v systemctl >/dev/null || { echo "install.sh: systemd is not running here" >&2; exit 1; }
    if ! id inferpool >/dev/null 2>&1; then
        useradd --system --user-group --home-dir /var/lib/inferpool --create-home \
            --shell /usr/sbin/nologin inferpool
    fi
    install -d -o inferpool -g inferpool -m 0750 /var/lib/inferpool/models
    python3 -m venv "$PREFIX/venv"
    "$PREFIX/venv/bin/pip" install --quiet --upgrade pip
    "$PREFIX/venv/bin/pip" install --quiet torch==2.13.0
    "$PREFIX/venv/bin/pip" install --quiet "$SRC"
fi

install -d -m 0755 "$DESTDIR/etc/systemd/system" "$DESTDIR/etc/inferpool"
sed "s|/opt/inferpool|$PREFIX|g" "$HERE/inferpool.service" > "$DESTDIR/etc/systemd/system/inferpool.service"
chmod 0644 "$DESTDIR/etc/systemd/system/inferpool.service"
if [ ! -e "$DESTDIR/etc/inferpool/inferpool.env" ]; then
    install -m 0644 "$HERE/inferpool.env" "$DESTDIR/etc/inferpool/inferpool.env"
fi

if [ -z "$DESTDIR" ]; then
    systemctl daemon-reload
    if [ "$START" = yes ]; then
        systemctl enable --now inferpool
        echo "inferpool is running: systemctl status inferpool; $PREFIX/venv/bin/inferpool status --endpoint ipc:///run/inferpool/broker.sock"
    else
        echo "installed; start with: systemctl enable --now inferpool"
    fi
else
    echo "staged under $DESTDIR"
fi
