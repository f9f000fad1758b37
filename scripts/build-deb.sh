#!/usr/bin/env bash
# Builds agentd's Debian package with dpkg-deb alone (no debhelper, no fakeroot):
#
#   bash scripts/build-deb.sh      # -> target/debian/agentd_<version>_<arch>.deb
#
# It runs `cargo build --release -p agentd` and packs:
#   /usr/bin/agentd                          the daemon
#   /lib/systemd/system/agentd.service       packaging/agentd.service (not enabled)
#   /etc/agentd/agentd.toml                  packaging/agentd.toml (a conffile)
#   /usr/share/agentd/agents/echo_agent.py   the example agent that configuration names
#   /usr/share/doc/agentd/copyright          packaging/copyright
# and the maintainer scripts packaging/{postinst,prerm,postrm}. The store's directory,
# /var/lib/agentd, is the unit's StateDirectory: systemd makes it, the package does not.
#
# Environment:
#   AGENTD_BIN=PATH      pack this binary instead of building one (the tests pack their
#                        debug build)
#   AGENTD_DEB_DIR=DIR   write the package to DIR instead of target/debian
#   DEBFULLNAME, DEBEMAIL  the Maintainer field (default: agentd maintainers)
#   DPKG_DEB_COMPRESSOR_TYPE, DPKG_DEB_COMPRESSOR_LEVEL  read by dpkg-deb itself
# Prints the package's path on stdout, last.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$repo"
trap 'echo "scripts/build-deb.sh: stopped at line $LINENO: $BASH_COMMAND" >&2' ERR

for tool in dpkg dpkg-deb python3; do
    type -P "$tool" >/dev/null || { echo "build-deb.sh: $tool is missing" >&2; exit 1; }
done

# The version and the target directory (CARGO_TARGET_DIR honoured) as cargo sees them.
read -r cargo_version target_dir < <("${CARGO:-cargo}" metadata --no-deps --format-version 1 |
    python3 -c 'import json, sys
m = json.load(sys.stdin)
print(next(p["version"] for p in m["packages"] if p["name"] == "agentd"), m["target_directory"])')
# A semver pre-release (0.2.0-rc.1) sorts before its release in Debian only as 0.2.0~rc.1.
version="${cargo_version/-/\~}"
arch="$(dpkg --print-architecture)"
out="${AGENTD_DEB_DIR:-$target_dir/debian}"

if [ -n "${AGENTD_BIN:-}" ]; then
    bin="$AGENTD_BIN"
else
    "${CARGO:-cargo}" build --release -p agentd >&2
    bin="$target_dir/release/agentd"
fi
[ -x "$bin" ] || { echo "build-deb.sh: $bin is not an executable" >&2; exit 1; }

mkdir -p "$out"
stage="$(mktemp -d "$out/.stage.XXXXXX")"
chmod 0755 "$stage" # mktemp made it 0700: it becomes the root directory
trap 'rm -rf "$stage"' EXIT

install -D -m 0755 "$bin" "$stage/usr/bin/agentd"
install -D -m 0644 packaging/agentd.service "$stage/lib/systemd/system/agentd.service"
install -D -m 0644 packaging/agentd.toml "$stage/etc/agentd/agentd.toml"
install -D -m 0644 examples/agents/echo_agent.py "$stage/usr/share/agentd/agents/echo_agent.py"
install -D -m 0644 packaging/copyright "$stage/usr/share/doc/agentd/copyright"

# Depends: the newest glibc symbol version the binary asks for (what dpkg-shlibdeps would
# find, read without binutils), 2.36 at least if it is linked with DT_RELR; libgcc_s when it
# is linked to it; python3 for the echo agent the configuration names.
glibc="$(LC_ALL=C grep -aoE 'GLIBC_[0-9]+\.[0-9]+(\.[0-9]+)?' "$bin" | sed 's/^GLIBC_//' |
    sort -uV | tail -n 1)"
[ -n "$glibc" ] || { echo "build-deb.sh: $bin names no GLIBC_ symbol version" >&2; exit 1; }
if LC_ALL=C grep -aq 'GLIBC_ABI_DT_RELR' "$bin"; then
    glibc="$(printf '%s\n' "$glibc" 2.36 | sort -V | tail -n 1)"
fi
depends="libc6 (>= $glibc)"
if LC_ALL=C grep -aq 'libgcc_s\.so\.1' "$bin"; then depends="$depends, libgcc-s1"; fi
depends="$depends, python3"

mkdir -p "$stage/DEBIAN"
size="$(du -sk --apparent-size "$stage" | cut -f1)"
sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" -e "s/@SIZE@/$size/" \
    -e "s/@DEPENDS@/$depends/" \
    -e "s/@MAINTAINER@/${DEBFULLNAME:-agentd maintainers} <${DEBEMAIL:-maintainers@agentd.dev}>/" \
    packaging/control >"$stage/DEBIAN/control"
install -m 0644 packaging/conffiles "$stage/DEBIAN/conffiles"
install -m 0755 packaging/postinst packaging/prerm packaging/postrm "$stage/DEBIAN/"
(cd "$stage" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z |
    xargs -0 md5sum) >"$stage/DEBIAN/md5sums"
chmod 0644 "$stage/DEBIAN/md5sums"

deb="$out/agentd_${version}_${arch}.deb"
# --root-owner-group: every file root:root, without fakeroot.
dpkg-deb --root-owner-group --build "$stage" "$deb" >&2
echo "$deb"
