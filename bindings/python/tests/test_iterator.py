"""`seam.gguf_weights_iterator` yields what vLLM's GGUF iterator yields:
the same names in the same order (each quantized tensor's `qweight_type`
first, then the data, `qweight` for the quantized ones), the same types,
shapes and bytes. The reference is vLLM's iterator written over gguf-py's
reader, as vLLM has it, with NumPy in place of `torch.tensor` (NumPy has
no bfloat16: gguf-py's BF16 bytes stay `uint8` there and here)."""

import unittest

import gguf
import numpy as np

import seam
import support

UNQUANTIZED = ("F32", "BF16", "F16")


def vllm_reference(path, name_map):
    """vLLM's `gguf_quant_weights_iterator`, NumPy for torch."""
    reader = gguf.GGUFReader(path)
    for tensor in reader.tensors:
        if name_map is not None and tensor.name not in name_map:
            continue
        name = tensor.name if name_map is None else name_map[tensor.name]
        if tensor.tensor_type.name not in UNQUANTIZED:
            yield name.replace("weight", "qweight_type"), np.array(int(tensor.tensor_type))
    for tensor in reader.tensors:
        if name_map is not None and tensor.name not in name_map:
            continue
        name = tensor.name if name_map is None else name_map[tensor.name]
        if tensor.tensor_type.name not in UNQUANTIZED:
            name = name.replace("weight", "qweight")
        yield name, np.array(tensor.data)


class LikeVllm(unittest.TestCase):
    def check(self, path, device, name_map=None):
        expected = list(vllm_reference(path, name_map))
        got = list(seam.gguf_weights_iterator(path, device, name_map, framework="numpy"))
        self.assertEqual([n for n, _ in got], [n for n, _ in expected])
        for (name, ours), (_, theirs) in zip(got, expected):
            with self.subTest(path=path, device=device, name=name):
                self.assertEqual(ours.dtype, theirs.dtype)
                self.assertEqual(ours.shape, theirs.shape)
                self.assertEqual(ours.tobytes(), theirs.tobytes())
        return got

    def test_every_type_on_the_host_and_the_fake_device(self):
        path = support.data("interop/quant_types.gguf")
        for device in ("host", "fake"):
            got = self.check(path, device)
            types = [n for n, a in got if a.ndim == 0]
            self.assertGreater(len(types), 20)

    def test_a_generated_model(self):
        # Not gemma: gguf-py's reader takes a minute over its vocabulary.
        self.check(support.generated(), "host")

    def test_a_name_map_picks_and_renames(self):
        path = support.data("interop/quant_types.gguf")
        name_map = {
            "t00.f32": "model.norm.weight",
            "t09.q4_k": "model.layers.0.mlp.weight",
            "t27.bf16": "model.layers.0.bf16.weight",
        }
        got = self.check(path, "fake", name_map)
        self.assertEqual(
            [n for n, _ in got],
            [
                "model.layers.0.mlp.qweight_type",
                "model.norm.weight",
                "model.layers.0.mlp.qweight",
                "model.layers.0.bf16.weight",
            ],
        )
        session = seam.open(path, "fake")
        list(seam.gguf_weights_iterator(path, "fake", name_map, framework="numpy"))
        self.assertEqual(session.counts["uploads"], 0, "sessions are separate")

    def test_only_mapped_tensors_are_staged(self):
        path = support.data("interop/quant_types.gguf")
        uploads = []
        list(
            seam.gguf_weights_iterator(
                path,
                "fake",
                {"t00.f32": "a.weight", "t01.f16": "b.weight"},
                framework="numpy",
                progress=lambda name, done, total: uploads.append(name),
            )
        )
        self.assertEqual(sorted(uploads), ["t00.f32", "t01.f16"])

    def test_an_unknown_framework_is_refused(self):
        with self.assertRaises(ValueError):
            next(seam.gguf_weights_iterator(support.data("interop/quant_types.gguf"), "host", framework="jax"))


if __name__ == "__main__":
    unittest.main()
