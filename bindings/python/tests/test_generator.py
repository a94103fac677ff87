"""`seam._seam._write_generated_model` writes, byte for byte, the model
`cargo xtask gen-gguf` writes for the same size and seed (the GPU machine
makes its benchmark model with the wheel, having no Rust)."""

import hashlib
import os
import tempfile
import unittest

import seam
import support


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            digest.update(chunk)
    return digest.hexdigest()


class Generator(unittest.TestCase):
    def test_the_wheel_writes_what_xtask_writes(self):
        reference = support.generated()
        size = 256 << 20
        self.assertTrue(reference.endswith("generated-256mib.gguf"), reference)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "m.gguf")
            written = seam._seam._write_generated_model(path, size, 1)
            self.assertEqual(written, os.path.getsize(reference))
            self.assertEqual(sha256_of(path), sha256_of(reference))
            one, two = os.path.join(d, "1.gguf"), os.path.join(d, "2.gguf")
            seam._seam._write_generated_model(one, 8 << 20, 1)
            seam._seam._write_generated_model(two, 8 << 20, 2)
            self.assertNotEqual(sha256_of(one), sha256_of(two), "the seed counts")

    def test_an_unwritable_path_is_a_gguf_error(self):
        with self.assertRaises(seam.GgufError):
            seam._seam._write_generated_model("/nonexistent-dir/m.gguf", 1 << 20)


if __name__ == "__main__":
    unittest.main()
