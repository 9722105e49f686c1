# Sourced by the GPU scripts: sets QG_SPM_CMAKE_ARGS to build the tokenizer module against
# the carried Debian libsentencepiece (0.1.97, scripts/pack_gpu_deps.sh), copied into a
# folder of its own so the module's RUNPATH finds it before the system's copy.
# Why: the lent image ships Ubuntu's libsentencepiece 0.2.0 with its headers. A CUDA build of
# qat aborted there as soon as it loaded the module ("free(): invalid pointer"; against the
# carried copy too, and with RTLD_DEEPBIND off a segmentation fault), while a CPU-only build
# trained and loaded a tokenizer with the carried copy. Not resolved: on the GPU, make the
# tokenizer and token cache on the CPU machine and carry them (data/token_data.h reads cached
# ids without loading SentencePiece).
QG_SPM_CMAKE_ARGS=()
if [ -f .gpudeps/root/usr/include/sentencepiece_processor.h ]; then
  qg_spm_dir=${QG_SPM_DIR:-/tmp/qg-sentencepiece}
  mkdir -p "$qg_spm_dir/lib" "$qg_spm_dir/include"
  cp -a .gpudeps/root/usr/lib/x86_64-linux-gnu/libsentencepiece* "$qg_spm_dir/lib/"
  cp -a .gpudeps/root/usr/include/sentencepiece_*.h "$qg_spm_dir/include/"
  QG_SPM_CMAKE_ARGS=(-DQG_SENTENCEPIECE_INCLUDE="$qg_spm_dir/include"
    -DQG_SENTENCEPIECE_LIBRARY="$qg_spm_dir/lib/libsentencepiece.so"
    -DQG_SENTENCEPIECE_TRAIN_LIBRARY="$qg_spm_dir/lib/libsentencepiece_train.so")
fi
# The carried python3.11-doc corpus, where `cp -n` into / did not make the default folder.
QG_CORPUS_ARGS=()
if [ ! -d /usr/share/doc/python3.11/html/_sources ] &&
  [ -d .gpudeps/root/usr/share/doc/python3.11/html/_sources ]; then
  QG_CORPUS_ARGS=(--corpus "$PWD/.gpudeps/root/usr/share/doc/python3.11/html/_sources")
fi
