"""Build and install commlib with its C kernels (csrc/)."""

from setuptools import Extension, find_packages, setup

kernels = Extension(
    "commlib._kernels",
    sources=["csrc/kernels.c"],
    extra_compile_args=["-O3", "-std=c11", "-fno-strict-aliasing"],
)

setup(
    name="commlib",
    version="0.1.0",
    description="Communication layer for data-parallel training: coordinator, fusion, topology-aware allreduce",
    packages=find_packages(include=["commlib", "commlib.*"]),
    ext_modules=[kernels],
    python_requires=">=3.9",
    install_requires=["numpy", "mpi4py>=3.1", "ml_dtypes"],
    extras_require={
        "mpich": ["mpich"],
        "torch": ["torch"],
        "bench": ["matplotlib"],
        "test": ["pytest"],
    },
    entry_points={"console_scripts": ["commlib-bench=commlib.bench.cli:main"]},
)
