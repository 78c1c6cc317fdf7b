// The engine's sampling rows (engine/sampler.h) on the GPU sampler (backend/cuda/sampling.cuh): the staging of one
// step's rows and the conversion of the read-back into SampledTokens. Used by CudaExecutor::forward_sample, the GPU
// sampling tests and tools/bench_sampling. Built only with -DM3_WITH_CUDA=ON (library m3_cuda_executor).
#pragma once

#include <cuda_runtime.h>

#include <span>
#include <vector>

#include "backend/cuda/sampling.cuh"
#include "engine/sampler.h"

namespace m3 {

// Stages rows[i] to sample logits row logit_rows[i] (rows without params get id −1) and queues the upload and the
// kernels on `s`; `logits` [*, V] are adjusted in place on the sampled rows.
void enqueue_device_sampling(cuda::DeviceSampler& sampler, float* logits, int vocab, std::span<const RowSampling> rows,
                             std::span<const int32_t> logit_rows, cudaStream_t s);
// The first half of enqueue_device_sampling: stages the rows and queues their upload, but launches no kernel (a
// captured decode graph holds the sampler's kernels: DeviceSampler::launch).
void stage_device_sampling(cuda::DeviceSampler& sampler, int vocab, std::span<const RowSampling> rows,
                           std::span<const int32_t> logit_rows, cudaStream_t s);
// Reads the ids (+ logprobs) back — the step's one host sync — and returns them in the CPU sampler's form.
std::vector<SampledToken> finish_device_sampling(cuda::DeviceSampler& sampler, std::span<const RowSampling> rows,
                                                 cudaStream_t s);

}  // namespace m3
