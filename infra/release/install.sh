#!/bin/sh
# Installs a released `gitstate` binary for this machine, checked against the release's SHA256SUMS.
#
#   sh infra/release/install.sh                      # the newest release, into ~/.local/bin
#   GITSTATE_VERSION=v0.2.0 GITSTATE_INSTALL_DIR=/usr/local/bin sh infra/release/install.sh
#
# Settings (environment):
#   GITSTATE_VERSION      a release tag (v1.2.3) or `latest` (default)
#   GITSTATE_INSTALL_DIR  where the binary goes (default: $HOME/.local/bin)
#   GITSTATE_REPO         owner/name of the GitHub repository that publishes the releases
#   GITSTATE_RELEASE_URL  the folder holding the release's files, instead of GitHub's (a mirror)
#   GITSTATE_TARGET       the platform to install, instead of this machine's (a Rust target triple)
# Nothing is installed unless the archive's checksum matches; every failure exits non-zero saying why.
set -eu

fail() {
  echo "gitstate install: $*" >&2
  exit 1
}

version="${GITSTATE_VERSION:-latest}"
install_dir="${GITSTATE_INSTALL_DIR:-${HOME:?set HOME or GITSTATE_INSTALL_DIR}/.local/bin}"

case "$version" in
  latest | v[0-9]*) ;;
  *) fail "GITSTATE_VERSION=$version: give a release tag such as v0.1.0, or latest" ;;
esac

if [ -n "${GITSTATE_TARGET:-}" ]; then
  target="$GITSTATE_TARGET"
else
  os="$(uname -s)"
  arch="$(uname -m)"
  case "$arch" in
    x86_64 | amd64) arch=x86_64 ;;
    aarch64 | arm64) arch=aarch64 ;;
    *) fail "no release binary for the processor $arch (build from a clone: cargo install --locked --path functions/gitstate-cli)" ;;
  esac
  case "$os" in
    Linux) target="$arch-unknown-linux-gnu" ;;
    Darwin) target="$arch-apple-darwin" ;;
    *) fail "no release binary for $os (build from a clone: cargo install --locked --path functions/gitstate-cli)" ;;
  esac
fi
case "$target" in
  x86_64-unknown-linux-gnu | aarch64-unknown-linux-gnu | x86_64-apple-darwin | aarch64-apple-darwin) ;;
  *) fail "no release binary for the target $target (releases have x86_64/aarch64 Linux (glibc) and macOS)" ;;
esac

if [ -n "${GITSTATE_RELEASE_URL:-}" ]; then
  base="${GITSTATE_RELEASE_URL%/}"
else
  repo="${GITSTATE_REPO:-}"
  [ -n "$repo" ] || fail "set GITSTATE_REPO to the owner/name of the repository that publishes gitstate's releases"
  case "$version" in
    latest) base="https://github.com/$repo/releases/latest/download" ;;
    *) base="https://github.com/$repo/releases/download/$version" ;;
  esac
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT TERM
# A download's own error (HTTP status, TLS, DNS) goes into the one line that says what failed.
if command -v curl >/dev/null 2>&1; then
  fetch() { curl --proto '=https,http,file' --proto-redir '=https' --fail --silent --show-error --location --output "$2" "$1" 2>"$work/error"; }
elif command -v wget >/dev/null 2>&1; then
  fetch() { wget --quiet --output-document "$2" "$1" 2>"$work/error"; }
else
  fail "neither curl nor wget is installed"
fi
why() { tr '\n' ' ' <"$work/error" | sed 's/ *$//'; }
if command -v sha256sum >/dev/null 2>&1; then
  digest() { sha256sum "$1" | cut -d' ' -f1; }
elif command -v shasum >/dev/null 2>&1; then
  digest() { shasum -a 256 "$1" | cut -d' ' -f1; }
else
  fail "neither sha256sum nor shasum is installed: the download cannot be checked"
fi

archive="gitstate-$target.tar.gz"

fetch "$base/SHA256SUMS" "$work/SHA256SUMS" ||
  fail "could not download $base/SHA256SUMS ($(why)): is $version a published release?"
fetch "$base/$archive" "$work/$archive" || fail "could not download $base/$archive ($(why))"

expected="$(awk -v name="$archive" '$2 == name || $2 == "*" name { print $1 }' "$work/SHA256SUMS")"
[ -n "$expected" ] || fail "$base/SHA256SUMS lists no $archive"
actual="$(digest "$work/$archive")"
[ "$expected" = "$actual" ] || fail "$archive is corrupt or was tampered with: its SHA-256 is $actual, SHA256SUMS says $expected; nothing installed"

mkdir "$work/unpacked"
tar -xzf "$work/$archive" -C "$work/unpacked" 2>"$work/error" || fail "could not unpack $archive ($(why))"
binary="$work/unpacked/gitstate-$target/gitstate"
[ -f "$binary" ] || fail "$archive holds no gitstate-$target/gitstate"
installed_version="$("$binary" --version 2>/dev/null)" || fail "the downloaded binary does not run on this machine ($target)"

# Copy next to the destination, then rename: a running gitstate is never overwritten in place.
staged="$install_dir/.gitstate.new.$$"
if ! { mkdir -p "$install_dir" && cp "$binary" "$staged" && chmod 0755 "$staged" && mv -f "$staged" "$install_dir/gitstate"; } 2>"$work/error"; then
  rm -f "$staged"
  fail "could not install into $install_dir ($(why)); choose another folder with GITSTATE_INSTALL_DIR"
fi

echo "installed $installed_version ($target) as $install_dir/gitstate"
case ":${PATH:-}:" in
  *":$install_dir:"*) ;;
  *) echo "note: $install_dir is not on PATH; add it: export PATH=\"$install_dir:\$PATH\"" ;;
esac
