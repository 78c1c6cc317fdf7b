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
# The media gateway's image codecs (+ OpenSSL for https fetching), ≈ 8 MB: with them the device builds m3_media
# without video (FFmpeg's libraries are ≈ 170 packages; src/media/CMakeLists.txt then answers videos with an error),
# so bench_media and image requests run on the GPU host too.
apt-get download libjpeg62-turbo-dev libjpeg62-turbo libturbojpeg0-dev libturbojpeg0 libpng-dev libpng16-16 \
  zlib1g-dev libwebp-dev libwebp7 libwebpdemux2 libwebpmux3 libgif-dev libgif7 libssl-dev libssl3
du -sh "$root/.gpudeps"
