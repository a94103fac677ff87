"""An array exported from a tensor keeps what it reads alive: the session
dropped (and collected) while the array lives, the array still holds the
tensor's bytes. Run in a child process on a tensor of tens of MiB, so a
mapping or a device copy freed under the array is unmapped (a fault in
the child), not read back stale."""

import unittest

import support

CHILD = """
import gc, hashlib, json, sys
import numpy as np
import seam
path, device, name = sys.argv[1:4]
session = seam.open(path, device)
tensor = session.resident(name)
array = np.from_dlpack(tensor)
raw = np.from_dlpack(tensor.raw())
del session, tensor
gc.collect()
# Memory freed above would be reused (or unmapped) by now.
filler = [bytearray(64 << 20) for _ in range(2)]
print(json.dumps([hashlib.sha256(array).hexdigest(), hashlib.sha256(raw).hexdigest()]))
"""


class DroppedSession(unittest.TestCase):
    def check(self, device, name):
        path = support.generated()
        expected = {t["name"]: t for t in support.inspect(path)["tensors"]}[name]
        self.assertGreater(expected["n_bytes"], 16 << 20)
        hashes = support.child_json(self, CHILD, path, device, name)
        self.assertEqual(hashes, [expected["sha256"]] * 2)

    def test_host_array_outlives_the_session(self):
        self.check("host", "token_embd.weight")

    def test_fake_device_array_outlives_the_session(self):
        self.check("fake", "output.weight")


if __name__ == "__main__":
    unittest.main()
