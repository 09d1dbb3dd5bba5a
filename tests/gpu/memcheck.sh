#!/usr/bin/env bash
# compute-sanitizer memcheck over the GPU tests that run the engine's kernels (unpack, gather and
# scatter) and its staging copies, over the emulated TCPX plugin and the socket transport:
#   tests/gpu/memcheck.sh <tcpx_gpu_tests>
# Fails on any report: an access outside an allocation, and also a CUDA call that returns an error
# (compute-sanitizer counts those too, so the engine's own probes must not fail where a failure
# is the expected answer). Exits 77 (skipped) where there is no GPU or no compute-sanitizer.
set -uo pipefail
bin=${1:?usage: memcheck.sh <tcpx_gpu_tests>}
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ ! -x "$cs" ]; then echo "SKIP: no compute-sanitizer"; exit 77; fi
if ! nvidia-smi -L > /dev/null 2>&1; then echo "SKIP: no GPU (nvidia-smi -L failed)"; exit 77; fi
filter='Unpack*:CudaMemory*'
filter+=':*EngineDevice.ManyTransfersInFlightAtOnce/*'
filter+=':*EngineDevice.ManySmallPiecesOfEveryKindPackedIntoChunks/*'
filter+=':*EngineDevice.VectorTransfersAcrossKinds/*'
filter+=':*EngineDevice.ShortGpuTransfersAreCutInSubChunksBothSidesAgreeOn/*'
exec "$cs" --tool memcheck --error-exitcode 3 "$bin" --gtest_filter="$filter"
