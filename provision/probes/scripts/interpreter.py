"""What the interpreter is: versions, and the CUDA/NCCL facts a GPU job depends on."""

from __future__ import annotations

import importlib
import platform
import sys
from typing import Any

from envcheck_probe_common import collector_off, emit, error_text


def main() -> None:
    result: dict[str, Any] = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "machine": platform.machine(),
    }
    for name in ("torch", "triton"):
        try:
            with collector_off():
                result[name] = importlib.import_module(name).__version__
        except Exception as exc:
            result[name] = None
            result[name + "_error"] = error_text(exc)
    if result["torch"]:
        import torch

        result["torch_cuda"] = torch.version.cuda
        try:
            result["cuda_available"] = torch.cuda.is_available()
            result["cuda_devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        except Exception as exc:
            result["cuda_available"], result["cuda_error"] = False, error_text(exc)
        if torch.version.cuda:
            try:
                result["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            except Exception as exc:
                result["nccl"], result["nccl_error"] = None, error_text(exc)
    emit(ok=True, **result)


if __name__ == "__main__":
    main()
