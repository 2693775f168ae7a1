"""GPU kinds the plan knows: bf16 dense peak, memory, interconnect bandwidth, each from a data sheet.

    kind = gpu_kind("B200")                  # by table name (case-insensitive), or
    kind = match_device_name(torch.cuda.get_device_name(0))   # the first key found in the device name

Figures are per GPU. Peaks are *dense* bf16 tensor-core FLOP/s: NVIDIA's data sheets print the sparse
figure ("with sparsity"), which is twice the dense one. Interconnect: the bandwidth one GPU can send to
its peers in one direction (NVLink data sheets print the bidirectional total, twice that). Several
nodes: the slowest link is the node's network, INTER_NODE_BYTES_PER_S per GPU unless known better.
trainer/loop/profiling.py's MFU table is derived from this one (one place for every peak).
`platform` is the conda subdir of the node's CPU, hence of the job's env: Grace nodes (GH200, GB200)
are linux-aarch64, the others linux-64 (docs/platforms.md).
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True)
class GpuKind:
    name: str  # table name, also the substring looked up in torch.cuda.get_device_name()
    bf16_dense_flops: float
    memory_bytes: float  # HBM capacity the data sheet states
    link_bytes_per_s: float  # one direction, per GPU, within a node
    link: str  # what that link is
    source: str  # the data sheet the figures come from
    platform: str = "linux-64"  # the node's CPU as a conda subdir: the env the job needs


# Order matters for match_device_name: the first name found in the device name wins (GB200 before B200,
# GH200 before H200, H100 NVL / PCIe before H100).
GPU_KINDS: tuple[GpuKind, ...] = (
    GpuKind(
        "GB200", 2.5e15, 186 * GB, 900 * GB, "NVLink 5 (1.8 TB/s bidirectional)",
        "NVIDIA GB200 NVL72 data sheet, nvidia.com/en-us/data-center/gb200-nvl72: 72 GPUs, 360 PFLOPS "
        "FP16/BF16 with sparsity, 13.4 TB HBM3e, 130 TB/s NVLink", "linux-aarch64",
    ),
    GpuKind(
        "B200", 2.25e15, 180 * GB, 900 * GB, "NVLink 5 (1.8 TB/s bidirectional)",
        "NVIDIA DGX B200 data sheet (resources.nvidia.com, dgx-b200-datasheet): 8 GPUs, 72 PFLOPS FP8 "
        "training = 36 PFLOPS BF16 with sparsity, 1,440 GB HBM3e, 14.4 TB/s NVLink",
    ),
    GpuKind(
        "GH200", 989e12, 96 * GB, 450 * GB, "NVLink 4 (900 GB/s bidirectional)",
        "NVIDIA GH200 Grace Hopper Superchip data sheet, nvidia.com/en-us/data-center/grace-hopper-"
        "superchip: H100 GPU, FP16/BF16 1,979 TFLOPS with sparsity, 96 GB HBM3 (144 GB HBM3e variant), "
        "NVLink 900 GB/s; Grace CPU (aarch64)", "linux-aarch64",
    ),
    GpuKind(
        "H200", 989e12, 141 * GB, 450 * GB, "NVLink 4 (900 GB/s bidirectional)",
        "NVIDIA H200 data sheet, nvidia.com/en-us/data-center/h200: H200 SXM, BF16 1,979 TFLOPS with "
        "sparsity, 141 GB HBM3e, NVLink 900 GB/s",
    ),
    GpuKind(
        "H100 NVL", 835e12, 94 * GB, 300 * GB, "NVLink bridge (600 GB/s bidirectional)",
        "NVIDIA H100 data sheet, nvidia.com/en-us/data-center/h100: H100 NVL, BF16 1,671 TFLOPS with "
        "sparsity, 94 GB, NVLink 600 GB/s",
    ),
    GpuKind(
        "H100 PCIe", 756e12, 80 * GB, 64 * GB, "PCIe Gen5 x16 (128 GB/s bidirectional)",
        "NVIDIA H100 PCIe data sheet: BF16 1,513 TFLOPS with sparsity, 80 GB HBM2e, PCIe Gen5 128 GB/s",
    ),
    GpuKind(
        "H100", 989e12, 80 * GB, 450 * GB, "NVLink 4 (900 GB/s bidirectional)",
        "NVIDIA H100 data sheet, nvidia.com/en-us/data-center/h100: H100 SXM, BF16 1,979 TFLOPS with "
        "sparsity, 80 GB HBM3, NVLink 900 GB/s",
    ),
    GpuKind(
        "A100", 312e12, 80 * GB, 300 * GB, "NVLink 3 (600 GB/s bidirectional)",
        "NVIDIA A100 data sheet, nvidia.com/en-us/data-center/a100: A100 80GB SXM, BF16 312 TFLOPS "
        "(624 with sparsity), 80 GB HBM2e, NVLink 600 GB/s",
    ),
)  # fmt: skip

# Between nodes: one 400 Gb/s (NDR InfiniBand / 400G Ethernet) NIC per GPU, one direction.
INTER_NODE_BYTES_PER_S = 50 * GB
INTER_NODE_LINK = "400 Gb/s network per GPU (NDR InfiniBand, one NIC per GPU)"


class UnknownGpu(ValueError):
    """A GPU kind not in the table; the message lists the table."""


def names() -> list[str]:
    return [k.name for k in GPU_KINDS]


def gpu_kind(name: str) -> GpuKind:
    for kind in GPU_KINDS:
        if kind.name.lower() == name.strip().lower():
            return kind
    raise UnknownGpu(f"unknown GPU kind {name!r}: the plan knows {', '.join(names())} (trainer/plan/gpus.py)")


def grace(kind: GpuKind) -> str:
    """ "" for an x86 node, else the line a plan prints: the node's platform and how to provision it."""
    if kind.platform == "linux-64":
        return ""
    return (
        f"{kind.name} nodes have a Grace CPU: platform {kind.platform}, so the job's env is the "
        f"{kind.platform} one (bin/provision NAME --platform {kind.platform} on a {kind.platform} node, "
        f"or from an x86 login node onto a shared filesystem, no emulation needed: docs/platforms.md)"
    )


def match_device_name(device_name: str) -> GpuKind | None:
    """The table entry whose name appears in a CUDA device name ("NVIDIA B200" -> B200), else None."""
    for kind in GPU_KINDS:
        if kind.name in device_name:
            return kind
    return None
