#!/usr/bin/env bash
# Installs the Debian packages m3serve needs to build and test (Debian 12 "bookworm").
# Idempotent: packages already present are skipped by apt. Run as root (or with sudo).
set -euo pipefail
PKGS=(
  build-essential cmake pkg-config git
  libboost1.81-dev nlohmann-json3-dev libfmt-dev libspdlog-dev libcli11-dev
  libxxhash-dev libpcre2-dev libutf8proc-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libpng-dev libturbojpeg0-dev libjpeg62-turbo-dev libwebp-dev libgif-dev
  libavformat-dev libavcodec-dev libswscale-dev libavutil-dev libssl-dev
  python3 python3-jinja2 python3-numpy
  clang-14 libclang-rt-14-dev
  nodejs
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PKGS[@]} packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install_deps: installed ${missing[*]}"
