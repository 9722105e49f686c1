#!/usr/bin/env bash
# Packs the build dependencies the lent GPU machine lacks (Eigen, the Boost headers the code
# includes, CLI11, GoogleTest, zlib) into .gpudeps/root, laid out as on this Debian machine,
# so `scripts/gpu_check.sh` there can copy them under / (adding files, replacing none), and the
# cuDNN frontend's headers into .gpudeps/cudnn/frontend (below). Run
# here after a build, since the Boost subset is read from the compiler's dependency files.
# The folder is git-ignored through .git/info/exclude and travels with `carry`.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.gpudeps/root
rm -rf "$dest"  # (.gpudeps/wheels, the carried torchao wheel, stays)
mkdir -p "$dest"
mkdir -p "$(git rev-parse --git-dir)/info"
exclude="$(git rev-parse --git-dir)/info/exclude"
grep -qxF "/.gpudeps/" "$exclude" 2>/dev/null || echo "/.gpudeps/" >>"$exclude"
copy() { for p in "$@"; do [ -e "$p" ] && cp -rL --parents "$p" "$dest"; done; return 0; }
lib=/usr/lib/x86_64-linux-gnu
copy /usr/include/eigen3 /usr/share/eigen3/cmake /usr/include/CLI /usr/share/cmake/CLI11
copy /usr/include/gtest /usr/include/gmock "$lib"/cmake/GTest "$lib"/libgtest.a \
  "$lib"/libgtest_main.a "$lib"/libgmock.a "$lib"/libgmock_main.a
copy /usr/include/zlib.h /usr/include/zconf.h "$lib"/libz.a
copy "$lib"/cmake/Boost-1.74.0 "$lib"/cmake/boost_headers-1.74.0 "$lib"/cmake/BoostDetectToolset-1.74.0.cmake
# Boost headers: exactly those the sources that include Boost pull in, from the
# preprocessor's dependency list (no build needed), plus any a build's .d files name.
{
  grep -rl --include='*.cpp' --include='*.h' --include='*.cu' --include='*.cuh' '#include <boost' \
    core ops autograd runtime nn train data export apps device 2>/dev/null |
    while read -r src; do g++ -std=c++17 -x c++ -I. -I/usr/include/eigen3 -M -MG "$src" 2>/dev/null || true; done
  find build* -name '*.d' -print0 2>/dev/null | xargs -0 cat 2>/dev/null || true
} | tr ' \\' '\n\n' | grep -E '^/usr/include/boost/' | sort -u >.gpudeps/boost_headers.txt
copy /usr/include/boost/version.hpp /usr/include/boost/config.hpp
while read -r h; do copy "$h"; done <.gpudeps/boost_headers.txt
# `qat train --model llama`: SentencePiece (headers, libraries, pkg-config file) and the
# corpus, the Python documentation's reStructuredText sources (12 MB).
copy /usr/include/sentencepiece_processor.h /usr/include/sentencepiece_trainer.h \
  "$lib"/libsentencepiece.so* "$lib"/libsentencepiece_train.so* "$lib"/pkgconfig/sentencepiece.pc
copy /usr/share/doc/python3.11/html/_sources
# causal_attention's cuDNN path: the header-only cuDNN frontend (3 MB, the include/ folder of
# the nvidia-cudnn-frontend wheel) in .gpudeps/cudnn/frontend, where CMake looks for it; cuDNN
# itself comes with torch's wheels on the GPU machine. Kept across runs (rm -rf it to refresh).
frontend=.gpudeps/cudnn/frontend
if [ ! -f "$frontend/include/cudnn_frontend.h" ]; then
  wheel_dir=$(mktemp -d)
  mkdir -p "$frontend"
  python3 -m pip download --quiet --no-deps --dest "$wheel_dir" "nvidia-cudnn-frontend==${CUDNN_FRONTEND_VERSION:-1.32.0}"
  unzip -q -o "$wheel_dir"/nvidia_cudnn_frontend-*.whl 'include/*' -d "$frontend"
  rm -rf "$wheel_dir"
fi
du -sh .gpudeps
