"""SM clock and power of GPU 0 from NVML, sampled in a thread while a
measurement runs (the device scripts)."""
import ctypes
import threading
import time


class Nvml:
    """SM clock (MHz) and power (W) of GPU 0, sampled in a thread."""

    def __init__(self):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        assert self.lib.nvmlInit_v2() == 0
        self.h = ctypes.c_void_p()
        assert self.lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self.h)) == 0
        v = ctypes.create_string_buffer(80)
        self.lib.nvmlSystemGetDriverVersion(v, 80)
        self.driver = v.value.decode()
        self.samples, self.stop = [], threading.Event()

    def clock(self):
        c = ctypes.c_uint()
        self.lib.nvmlDeviceGetClockInfo(self.h, 1, ctypes.byref(c))  # NVML_CLOCK_SM
        return c.value

    def power(self):
        p = ctypes.c_uint()
        self.lib.nvmlDeviceGetPowerUsage(self.h, ctypes.byref(p))
        return p.value / 1000

    def _run(self):
        while not self.stop.is_set():
            self.samples.append((self.clock(), self.power()))
            time.sleep(0.002)

    def __enter__(self):
        self.samples, self.stop = [], threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()
        return self

    def __exit__(self, *a):
        self.stop.set()
        self.t.join()

    def summary(self):
        s = self.samples or [(0, 0)]
        return {"sm_clock_mhz_mean": sum(c for c, _ in s) / len(s), "power_w_mean": sum(p for _, p in s) / len(s),
                "power_w_max": max(p for _, p in s), "samples": len(s)}
