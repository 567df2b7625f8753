#!/usr/bin/env bash
# Installs CapGate where deploy/capgate.service runs it:
#   /usr/local/bin/capgate                      the release binary (migrations and SQL functions are inside it)
#   /etc/capgate/capgate.env                    secrets and settings (0640 root:capgate; kept if present)
#   /etc/capgate/capgate.json                   defaults (kept if present)
#   /etc/systemd/system/capgate.service         the unit
#   /usr/local/share/doc/capgate/               README.md and docs/
#   /var/lib/capgate                            state (the spool), made by systemd (StateDirectory=)
#
# Usage: deploy/install.sh [--binary FILE] [--root DIR]
#   --binary FILE  the release binary to install (default: build it with
#                  `swift build -c release --product capgate`)
#   --root DIR     install under DIR instead of / (a package, a test): no user is created and
#                  systemd is not told
# Then: edit /etc/capgate/capgate.env (DATABASE_URL, UPSTREAM_URL, UPSTREAM_API_KEY, OPERATOR_TOKEN),
# `capgate check-config` as the capgate user, `systemctl enable --now capgate`.
set -euo pipefail
cd "$(dirname "$0")/.."

root=""
binary=""
while [ $# -gt 0 ]; do
    case "$1" in
        --binary) binary=$2; shift 2 ;;
        --root) root=${2%/}; shift 2 ;;
        *) echo "usage: $0 [--binary FILE] [--root DIR]" >&2; exit 2 ;;
    esac
done

if [ -z "$binary" ]; then
    swift build -c release --product capgate
    binary=$(swift build -c release --show-bin-path)/capgate
fi
[ -x "$binary" ] || { echo "no executable binary at $binary" >&2; exit 2; }

if [ -z "$root" ]; then
    [ "$(id -u)" = 0 ] || { echo "run as root (or with --root DIR)" >&2; exit 2; }
    if ! id capgate >/dev/null 2>&1; then
        useradd --system --home-dir /var/lib/capgate --no-create-home --shell /usr/sbin/nologin capgate
    fi
fi

install -D -m 0755 "$binary" "$root/usr/local/bin/capgate"
install -D -m 0644 deploy/capgate.service "$root/etc/systemd/system/capgate.service"
install -d -m 0750 "$root/etc/capgate"
# A configuration already there is the operator's: never overwritten.
[ -e "$root/etc/capgate/capgate.env" ] || install -m 0640 deploy/capgate.env "$root/etc/capgate/capgate.env"
[ -e "$root/etc/capgate/capgate.json" ] || install -m 0640 deploy/capgate.json "$root/etc/capgate/capgate.json"
if [ -z "$root" ]; then
    chgrp capgate /etc/capgate /etc/capgate/capgate.env /etc/capgate/capgate.json
fi
install -d -m 0755 "$root/usr/local/share/doc/capgate"
install -m 0644 README.md BENCHMARKS.md "$root/usr/local/share/doc/capgate/"
if [ -d docs ]; then cp -R docs/. "$root/usr/local/share/doc/capgate/"; fi

# systemd-analyze exits 0 on an unknown directive (a typo in a hardening line): any word from it
# is a failure.
verify() {
    local said
    said=$(systemd-analyze verify --man=no "$1" 2>&1) || { echo "$said" >&2; exit 1; }
    [ -z "$said" ] || { echo "systemd-analyze verify: $said" >&2; exit 1; }
}

if [ -n "$root" ]; then
    # `verify --root` wants a whole system under DIR; the unit is checked on this machine with
    # its paths pointing into DIR instead (same directives, the installed binary).
    check=$(mktemp -d)
    sed -e "s|/usr/local/bin/capgate|$root/usr/local/bin/capgate|g" -e "s|/etc/capgate/|$root/etc/capgate/|g" \
        "$root/etc/systemd/system/capgate.service" >"$check/capgate.service"
    verify "$check/capgate.service"
    rm -r "$check"
else
    verify /etc/systemd/system/capgate.service
    if [ -d /run/systemd/system ]; then systemctl daemon-reload; fi
fi
echo "installed under ${root:-/}; next: edit $root/etc/capgate/capgate.env, then"
echo "  runuser -u capgate -- sh -c 'set -a; . /etc/capgate/capgate.env; CAPGATE_CONFIG=/etc/capgate/capgate.json exec /usr/local/bin/capgate check-config'"
echo "  systemctl enable --now capgate   (journalctl -u capgate shows why if check-config refuses)"
