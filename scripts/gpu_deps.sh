#!/usr/bin/env bash
# Downloads (here, with apt) the Debian packages m3serve's C++ build needs into .gpudeps/, for the device machine,
# which has no package registry. scripts/gpu_run.sh unpacks them there. The folder is git-ignored through
# .git/info/exclude and travels with `run`'s carry: [".gpudeps"].
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$root/.gpudeps"
grep -qx '/.gpudeps/' "$root/.git/info/exclude" 2>/dev/null || { mkdir -p "$root/.git/info"; echo '/.gpudeps/' >>"$root/.git/info/exclude"; }
cd "$root/.gpudeps"
apt-get download libfmt-dev libfmt9 libspdlog-dev libspdlog1.10 nlohmann-json3-dev libcli11-dev libpcre2-dev \
  libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libutf8proc-dev libutf8proc2 libxxhash-dev libxxhash0 \
  libgtest-dev libgmock-dev pkgconf pkgconf-bin libpkgconf3 libboost1.81-dev
du -sh "$root/.gpudeps"
