# Sourced by the scripts that run on a GPU machine (gpu-run.sh, gpu-probe/run*.sh): the CUDA
# toolkit's tools and libraries, NVRTC from the image's Python packages (nvidia-cuda-nvrtc)
# after the toolkit's, and the settings every GPU test and benchmark runs with.
export PATH=/usr/local/cuda/bin:$PATH
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
nv=$(python3 -c 'import nvidia, os; print(list(nvidia.__path__)[0])' 2>/dev/null)
for d in "$nv"/cu13/lib "$nv"/cuda_nvrtc/lib; do
  [ -n "$nv" ] && [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
export RESIDENT_REQUIRE_GPU=1 RESIDENT_REQUIRE_NVRTC=1 RESIDENT_KERNEL_CACHE=/tmp/resident-kcache \
  RUST_BACKTRACE=1
