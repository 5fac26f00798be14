"""How long does autotune's float64 reference take on the GPU? rawconv.check.reference for a few
ResNet-50 problems (batch 32, channels_last), first call (a new shape) and second call, with
torch's cuDNN on and off, cudnn.benchmark on and off.

    python benchmarks/diag_reference_time.py
"""
from __future__ import annotations

import time

import torch

from rawconv import ConvProblem, check

DESCS = ("mb32ic64ih56oc256oh56kh1", "mb32ic128ih56oc128oh28kh3sh2ph1", "mb32ic256ih56oc128oh56kh1",
         "mb32ic3ih224oc64oh112kh7sh2ph3", "mb32ic512ih14oc512oh7kh3sh2ph1")


def main():
    for enabled, bench in ((True, True), (True, False), (False, False)):
        torch.backends.cudnn.enabled, torch.backends.cudnn.benchmark = enabled, bench
        for i, d in enumerate(DESCS):
            # a distinct batch per setting: every setting sees new shapes
            p = ConvProblem.from_benchdnn(d.replace("mb32", f"mb{32 - 2 * (enabled + 2 * bench)}"), dtype="float16",
                                          layout="nhwc").with_(device="cuda")
            x, w, _ = p.make_inputs(device="cuda")
            t = {"x": x, "w": w, "b": None}
            times = []
            for _ in range(2):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                check._reference(p, "forward", t, None)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            print(f"cudnn {'on ' if enabled else 'off'} benchmark {'on ' if bench else 'off'} {p.describe():<60} "
                  f"first {times[0] * 1e3:8.1f} ms, again {times[1] * 1e3:8.1f} ms", flush=True)


if __name__ == "__main__":
    main()
