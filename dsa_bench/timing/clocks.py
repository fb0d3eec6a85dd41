"""SM and memory clocks around each trial, and the driver's identity for the environment record.
"""

from __future__ import annotations


class ClockReader:
    """SM and memory clocks of one GPU, read through NVML (nvidia-ml-py) or nvidia-smi.

    Clocks are read around every timed trial so a run whose SM clock sagged (thermal or power
    throttling) is flagged instead of silently reported.
    """

    def __init__(self, device_index: int) -> None:
        self.device_index = device_index
        self._nvml: object | None = None
        self._handle: object | None = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
            # bound now, like the timers' functions
            self._clock_info, self._sm, self._mem = pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM
        except Exception:  # no NVML bindings: fall back to nvidia-smi
            self._nvml = None
        self._smi = _nvidia_smi

    def read(self) -> dict[str, int] | None:
        """Current clocks in MHz, or None when neither NVML nor nvidia-smi answers."""
        if self._nvml is not None:
            return {"sm_mhz": int(self._clock_info(self._handle, self._sm)), "mem_mhz": int(self._clock_info(self._handle, self._mem))}
        values = self._smi(self.device_index, "clocks.sm,clocks.mem")
        return None if values is None else {"sm_mhz": int(values[0]), "mem_mhz": int(values[1])}


def _nvidia_smi(device_index: int, fields: str) -> list[str] | None:
    import subprocess

    try:
        out = subprocess.run(
            ["nvidia-smi", f"--id={device_index}", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
        return [v.strip() for v in out.strip().split(",")]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def driver_info(device_index: int) -> dict[str, object]:
    """Driver version and maximum clocks of a GPU, for the environment record."""
    values = _nvidia_smi(device_index, "driver_version,clocks.max.sm,clocks.max.mem,power.limit")
    if values is None:
        return {}
    keys = ("driver", "max_sm_mhz", "max_mem_mhz", "power_limit_w")
    return dict(zip(keys, values, strict=False))  # an environment record: what nvidia-smi answered, as far as it goes
