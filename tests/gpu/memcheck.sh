#!/usr/bin/env bash
# compute-sanitizer memcheck over the GPU tests that run the engine's kernels (unpack, gather and
# scatter) and its staging copies, over the emulated TCPX plugin and the socket transport:
#   tests/gpu/memcheck.sh <tcpx_gpu_tests> [memcheck|initcheck]
# Fails on any report: an access outside an allocation, and also a CUDA call that returns an error
# (compute-sanitizer counts those too, so the engine's own probes must not fail where a failure
# is the expected answer). Exits 77 (skipped) where there is no GPU or no compute-sanitizer.
# initcheck (a read of GPU memory nothing wrote: bytes sent that no one filled, say) runs every
# test of the binary, and wants a build with -DTCPX_P2P_INITCHECK=ON, whose unpack kernel reads
# its list only after the entry count (the default build reads a warp's first entry early, by
# design, and initcheck would report that read for every launch). scripts/run-gpu initcheck.
set -uo pipefail
bin=${1:?usage: memcheck.sh <tcpx_gpu_tests> [memcheck|initcheck]}
tool=${2:-memcheck}
engine_tests=(ManyTransfersInFlightAtOnce ManySmallPiecesOfEveryKindPackedIntoChunks
    VectorTransfersAcrossKinds ShortGpuTransfersAreCutInSubChunksBothSidesAgreeOn)
case "$tool" in
memcheck)
    filter='Unpack*:CudaMemory*'
    for t in "${engine_tests[@]}"; do filter+=":*EngineDevice.$t/*"; done
    # The randomized mixed traffic (tests/engine/engine_stress_test.cc), each setting for its
    # default 1.5 s: cancels and both copy paths, at random moments.
    filter+=':*EngineStress.*'

    ;;
initcheck) filter='*' ;;
*) echo "memcheck.sh: unknown tool '$tool' (memcheck or initcheck)" >&2; exit 2 ;;
esac
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ ! -x "$cs" ]; then echo "SKIP: no compute-sanitizer"; exit 77; fi
if ! nvidia-smi -L > /dev/null 2>&1; then echo "SKIP: no GPU (nvidia-smi -L failed)"; exit 77; fi
exec "$cs" --tool "$tool" --error-exitcode 3 "$bin" --gtest_filter="$filter"
