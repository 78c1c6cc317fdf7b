#!/usr/bin/env bash
# Sourced by the device-side scripts (scripts/gpu_run.sh, scripts/gpu_e2e_bench.sh): makes m3serve's C++
# dependencies available on the device machine, which has nvcc, cmake and PyTorch but none of them and no package
# registry. `bash scripts/gpu_deps.sh` (run here, with apt) downloads the Debian packages into .gpudeps/, the device
# run carries that folder (run's `carry`), and this unpacks them into /tmp and points CMake / pkg-config there.
#   in:  $root (the repository root)
#   out: the array cmake_extra (extra `cmake -S -B` arguments); PKG_CONFIG_PATH, LD_LIBRARY_PATH, PATH, CUDACXX
cmake_extra=()
if ls "$root"/.gpudeps/*.deb >/dev/null 2>&1; then
  deps=/tmp/m3-gpudeps
  stamp="$(ls -l "$root"/.gpudeps/*.deb | awk '{print $5, $NF}' | sed "s|$root/||")"
  if [ "$(cat "$deps/.m3-unpacked" 2>/dev/null)" != "$stamp" ]; then  # unpack once per set of packages
    rm -rf "$deps" && mkdir -p "$deps"
    for f in "$root"/.gpudeps/*.deb; do
      if command -v dpkg-deb >/dev/null; then
        dpkg-deb -x "$f" "$deps"
      else
        (cd /tmp && rm -rf m3deb && mkdir m3deb && cd m3deb && ar x "$f" && tar -xf data.tar.* -C "$deps")
      fi
    done
    # Relocate pkg-config files from /usr to the unpacked prefix.
    find "$deps" -name '*.pc' -exec sed -i "s|=/usr|=$deps/usr|g; s|-I/usr/|-I$deps/usr/|g; s|-L/usr/|-L$deps/usr/|g" {} +
    echo "$stamp" >"$deps/.m3-unpacked"
  fi
  export PKG_CONFIG_PATH="$deps/usr/lib/x86_64-linux-gnu/pkgconfig:$deps/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  export LD_LIBRARY_PATH="$deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # Debian keeps per-architecture headers (jconfig.h, openssl/configuration.h) in include/x86_64-linux-gnu, which no
  # .pc file names: without this the compiler takes the device's own Ubuntu copies, e.g. libjpeg-turbo8's jconfig.h
  # (JPEG_LIB_VERSION 80) against the carried libjpeg62 → "Wrong JPEG library version" at the first decode.
  export CPATH="$deps/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}"
  cmake_extra+=(-DCMAKE_PREFIX_PATH="$deps/usr")
  command -v pkg-config >/dev/null || cmake_extra+=(-DPKG_CONFIG_EXECUTABLE="$deps/usr/bin/pkgconf")
fi
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
if command -v nvcc >/dev/null; then export CUDACXX="${CUDACXX:-$(command -v nvcc)}"; fi
