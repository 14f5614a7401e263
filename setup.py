"""Build and install commlib with its C kernels (csrc/)."""

from setuptools import Extension, find_packages, setup

# The SIMD loops (csrc/kernels_x86.c) carry their own target attributes and run only after a CPU check,
# so the module is built for the baseline architecture and still uses AVX2/F16C where the CPU has them.
kernels = Extension(
    "commlib._kernels",
    sources=["csrc/kernels.c", "csrc/kernels_portable.c", "csrc/kernels_x86.c"],
    depends=["csrc/kernels.h"],
    extra_compile_args=["-O3", "-std=c11", "-fno-strict-aliasing"],
)

# Cross-memory attach between the ranks of one node; reduces with the same loops as commlib._kernels.
peer_memory = Extension(
    "commlib._peer_memory",
    sources=["csrc/peer_memory.c", "csrc/kernels_portable.c", "csrc/kernels_x86.c"],
    depends=["csrc/kernels.h"],
    extra_compile_args=["-O3", "-std=gnu11", "-fno-strict-aliasing"],
)

# Top-k selection and scatter-add for the sparse compressors (commlib/compression/).
compression = Extension(
    "commlib._compression",
    sources=["csrc/compression.c"],
    extra_compile_args=["-O3", "-std=c11", "-fno-strict-aliasing"],
)

setup(
    name="commlib",
    version="0.1.0",
    description="Communication layer for data-parallel training: coordinator, fusion, topology-aware allreduce",
    packages=find_packages(include=["commlib", "commlib.*"]),
    py_modules=["commlib_torch_backend"],  # torch's entry point, outside the package (see the module)
    ext_modules=[kernels, peer_memory, compression],
    python_requires=">=3.9",
    install_requires=["numpy", "mpi4py>=3.1", "ml_dtypes"],
    extras_require={
        "mpich": ["mpich"],
        "torch": ["torch"],
        # commlib.jax (docs/jax.md): JAX on the CPU (jaxlib comes with jax) and optax for the optimizer wrappers.
        "jax": ["jax>=0.4.35", "optax>=0.2.3"],
        # commlib.tensorflow (docs/tensorflow.md); the GPU build "tensorflow" works as well for CPU tensors.
        "tensorflow": ["tensorflow-cpu>=2.16"],
        # commlib.keras (Keras 3 on any backend) and commlib.tensorflow.keras on tf-keras (TF_USE_LEGACY_KERAS=1)
        "keras": ["keras>=3", "tf-keras"],
        # GPU tensors (docs/gpu.md): CuPy for the device side, NCCL's wheel for the NCCL transport.
        "cuda12": ["cupy-cuda12x>=13", "nvidia-nccl-cu12>=2.18.1,<3"],
        "cuda13": ["cupy-cuda13x>=13.6", "nvidia-nccl-cu13>=2.27,<3"],
        "bench": ["matplotlib"],
        # commlib.ray (docs/launcher.md, Ray): RayExecutor on Ray; Ray Train's backend needs ray[train]
        "ray": ["ray[train]>=2.60"],
        # parameterized: Horovod's test_tensorflow2_keras.py, which scripts/horovod_compat_tf.py runs
        # expecttest: PyTorch's DistributedTest (scripts/torch_distributed_test.py) imports it
        "test": ["pytest", "hypothesis", "parameterized", "expecttest"],
    },
    entry_points={"console_scripts": ["commlib-bench=commlib.bench.cli:main", "commlib-run=commlib.run:main",
                                     "commlib-server=commlib.server.__main__:main"],
                  # torch calls these at the end of `import torch`: the "commlib" backend is known by name
                  "torch.backends": ["commlib=commlib_torch_backend:autoload"]},
)
