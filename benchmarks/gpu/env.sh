# Sourced by the step scripts in this folder, on the H200 machine, from the project root.
# vLLM 0.26 from the offline bundle (install-vllm.sh) in /tmp/site; qlift from this checkout.
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export QLIFT_HOME="${QLIFT_HOME:-/tmp/qlift-home}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# FlashInfer's sampler JIT-compiles kernels for minutes at the first start; greedy load does not need it.
export VLLM_USE_FLASHINFER_SAMPLER=0
# NVLink multicast stays off on these machines (see the device notes).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OUT="${OUT:-/tmp/qlift-gpu-out}"
mkdir -p "$OUT"
