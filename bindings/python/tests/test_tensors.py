"""Every tensor through the package equals `seam inspect --hash`: the table
(names, types, GGUF dims, offsets, byte lengths, shards) and the bytes, as
read through the DLPack export and as the device holds them, on the host,
fake and sink devices; the export's type and row-major shape; and the
export is no copy (a host array lies in the file's own mapping)."""

import hashlib
import unittest

import numpy as np

import seam
import support

# The element types and their NumPy names; every other type is raw blocks.
ELEMENTS = {
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F64": "float64",
    "I8": "int8",
    "I16": "int16",
    "I32": "int32",
    "I64": "int64",
}


def files():
    return [
        support.data("interop/quant_types.gguf"),
        support.data("interop/split-00001-of-00003.gguf"),
        support.gemma(),
    ]


def table(infos):
    return [(t.name, t.ggml_type, list(t.dims), t.offset, t.n_bytes, t.split) for t in infos]


def inspect_table(expected):
    return [
        (e["name"], e["ggml_type"], e["dims"], e["offset"], e["n_bytes"], e["split"])
        for e in expected
    ]


def expected_shape(e):
    if e["ggml_type"] in ELEMENTS:
        return tuple(reversed(e["dims"]))
    return (e["n_bytes"],)


def mapping_of(address):
    """(path, file offset) of the mapping of this process that holds
    `address`, from /proc/self/maps; None where no file mapping does."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in parts[0].split("-"))
            if start <= address < end and len(parts) == 6 and parts[5].startswith("/"):
                return parts[5].strip(), int(parts[2], 16) + address - start
    return None


class TensorsEqualInspect(unittest.TestCase):
    def check(self, path, device):
        expected = support.inspect(path)["tensors"]
        session = seam.open(path, device)
        self.assertEqual(session.device, device)
        self.assertEqual(len(session), len(expected))
        self.assertEqual(table(session), inspect_table(expected))
        self.assertEqual(table(session.tensors), inspect_table(expected))
        staged = session.stage_all()
        self.assertEqual([t.name for t in staged], [e["name"] for e in expected])
        for t, e in zip(staged, expected):
            with self.subTest(path=path, device=device, tensor=e["name"]):
                self.assertEqual((t.ggml_type, list(t.dims), t.n_bytes), (e["ggml_type"], e["dims"], e["n_bytes"]))
                # As the device holds them (what `seam load --hash` prints).
                self.assertEqual(t.sha256(), e["sha256"])
                if device == "sink":
                    with self.assertRaises(BufferError):
                        np.from_dlpack(t)
                    continue
                # As read through the export.
                raw = np.from_dlpack(t.raw())
                self.assertEqual((raw.dtype.name, raw.shape), ("uint8", (e["n_bytes"],)))
                self.assertEqual(hashlib.sha256(raw).hexdigest(), e["sha256"])
                self.assertEqual(t.dtype, ELEMENTS.get(e["ggml_type"], "uint8"))
                self.assertEqual(tuple(t.shape), expected_shape(e))
                if t.dtype == "bfloat16":
                    continue  # NumPy has no bfloat16; the raw bytes are checked above.
                array = np.from_dlpack(t)
                self.assertEqual((array.dtype.name, array.shape), (t.dtype, expected_shape(e)))
                self.assertEqual(array.ctypes.data, raw.ctypes.data)
                self.assertEqual(hashlib.sha256(array).hexdigest(), e["sha256"])

    def test_host(self):
        for path in files():
            self.check(path, "host")

    def test_fake(self):
        for path in files():
            self.check(path, "fake")

    def test_sink(self):
        for path in files():
            self.check(path, "sink")


class MmapOff(unittest.TestCase):
    def test_owned_weights_export_their_bytes(self):
        path = support.data("interop/quant_types.gguf")
        expected = {e["name"]: e for e in support.inspect(path)["tensors"]}
        for device in ("host", "fake"):
            session = seam.open(path, device, gguf_mmap=False)
            self.assertIn("mmap=off (env VT_GGUF_MMAP)", session.policy_line)
            for t in session.stage_all():
                with self.subTest(device=device, tensor=t.name):
                    raw = np.from_dlpack(t.raw())
                    self.assertEqual(hashlib.sha256(raw).hexdigest(), expected[t.name]["sha256"])
                    self.assertIsNone(mapping_of(raw.ctypes.data), "an owned copy, not the mapping")
                    self.assertEqual(raw.flags.writeable, device == "fake")


class ExportsAreNoCopies(unittest.TestCase):
    def test_a_host_array_is_the_files_own_mapping_read_only(self):
        path = support.data("interop/quant_types.gguf")
        session = seam.open(path, "host")
        for info in session:
            with self.subTest(tensor=info.name):
                array = np.from_dlpack(session.resident(info.name).raw())
                where = mapping_of(array.ctypes.data)
                self.assertIsNotNone(where)
                self.assertEqual(where, (path, info.offset))
                self.assertFalse(array.flags.writeable, "the mapping is read-only")

    def test_a_fake_device_array_is_its_device_copy(self):
        path = support.data("interop/quant_types.gguf")
        session = seam.open(path, "fake")
        t = session.resident("t02.q4_0")
        first = np.from_dlpack(t)
        again = np.from_dlpack(session.resident("t02.q4_0"))
        self.assertEqual(first.ctypes.data, again.ctypes.data, "one device copy, staged once")
        self.assertIsNone(mapping_of(first.ctypes.data), "not the file's pages")
        self.assertEqual(t.__dlpack_device__(), (1, 0))
        self.assertEqual(session.counts["uploads"], 1)


if __name__ == "__main__":
    unittest.main()
