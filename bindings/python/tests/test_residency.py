"""A Python process that loads a model through the package grows by the
staging ring and a little, not by the model: on the sink (which verifies
and discards, so a model larger than memory can be loaded), a 256 MiB
model through a ring of 4 x 4 MiB raises the peak RSS (VmHWM, reset after
the session opened) by less than 48 MiB. The bound holds whatever the
model's size, so a process limited to that much memory above its baseline
loads a model several times larger: what the test proves without a
cgroup. The control reads the same model through host arrays of the
mapping and grows by most of it, so the measurement sees a load that
keeps its pages."""

import json
import unittest

import support

MIB = 1 << 20
RING = 4 * 4 * MIB
SLACK = 32 * MIB

CHILD = """
import hashlib, json, sys
import numpy as np
import seam
path, device = sys.argv[1:3]
knobs = json.loads(sys.argv[3])
session = seam.open(path, device, **knobs)
seam.reset_peak()
before = seam.residency()
staged = session.stage_all()
if device == "host":
    for t in staged:
        hashlib.sha256(np.from_dlpack(t.raw())).hexdigest()
after = seam.residency()
print(json.dumps({"baseline": before["rss"], "peak": after["peak"], "counts": session.counts}))
"""


class HostGrowth(unittest.TestCase):
    def measure(self, device, **knobs):
        return support.child_json(self, CHILD, support.generated(), device, json.dumps(knobs))

    def test_a_sink_load_grows_by_the_ring_not_the_model(self):
        model = sum(t["n_bytes"] for t in support.inspect(support.generated())["tensors"])
        self.assertGreaterEqual(model, 4 * (RING + SLACK), "the model dwarfs the bound")
        got = self.measure(
            "sink",
            pinned_h2d_mib=4,
            pinned_h2d_buffers=4,
            pinned_h2d_readers=2,
            pinned_h2d_lanes=2,
        )
        self.assertEqual(got["counts"]["uploaded_bytes"], model, "every byte went through")
        growth = got["peak"] - got["baseline"]
        self.assertLess(growth, RING + SLACK, f"peak grew {growth / MIB:.1f} MiB")

    def test_the_control_that_keeps_its_pages_grows_by_the_model(self):
        model = sum(t["n_bytes"] for t in support.inspect(support.generated())["tensors"])
        got = self.measure("host", gguf_prefault=False)
        growth = got["peak"] - got["baseline"]
        self.assertGreater(growth, model // 2, f"peak grew {growth / MIB:.1f} MiB")


if __name__ == "__main__":
    unittest.main()
