"""A bad file, knob, config or device raises the exception class of its
kind, a `seam.SeamError`, whose message is the very line `seam load`
prints after `seam: error: ` for the same input; a name the model lacks is
a `KeyError`."""

import json
import os
import tempfile
import unittest

import seam
import support

QUANT_TYPES = "interop/quant_types.gguf"


def cli_line(*args, env=None):
    """`seam load ARGS`, which must fail with status 2 and one stderr line;
    that line."""
    done = support.seam("load", *args, env=env)
    if done.returncode != 2 or done.stderr.count("\n") != 1:
        raise AssertionError(f"seam load {args}: status {done.returncode}, stderr {done.stderr!r}")
    return done.stderr


class SameLineAsTheCli(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def write(self, name, data):
        path = os.path.join(self.dir.name, name)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def check(self, cls, cli_args, call, env=None):
        line = cli_line(*cli_args, env=env)
        with self.assertRaises(cls) as raised:
            call()
        self.assertIsInstance(raised.exception, seam.SeamError)
        self.assertEqual(f"seam: error: {raised.exception}\n", line)
        return raised.exception

    def test_bad_files_raise_gguf_error(self):
        with open(support.data(QUANT_TYPES), "rb") as f:
            good = f.read()
        cases = {
            "bad_magic.gguf": b"NOPE" + good[4:],
            "truncated.gguf": good[:100],
            "header_only.gguf": good[:24],
            "\x1bescape.gguf": good[:100],
        }
        for name, data in cases.items():
            with self.subTest(name=name):
                path = self.write(name, data)
                for device in ("fake", "host", "sink"):
                    e = self.check(
                        seam.GgufError,
                        [path, "--device", device],
                        lambda: seam.open(path, device),
                    )
                    self.assertEqual(e.file, path)
                    self.assertIsInstance(e.offset, int)
                    self.assertTrue(e.field, "the field is named")
                    self.assertIn(e.field, str(e))
                    self.assertNotIn("\x1b", str(e), "control bytes are escaped")
        missing = os.path.join(self.dir.name, "missing.gguf")
        self.check(seam.GgufError, [missing, "--device", "fake"], lambda: seam.open(missing, "fake"))

    def test_a_bad_knob_raises_policy_error(self):
        path = support.data(QUANT_TYPES)
        self.check(
            seam.PolicyError,
            [path, "--device", "fake"],
            lambda: seam.open(path, "fake", pinned_h2d_mib="x"),
            env={"VT_PINNED_H2D_MIB": "x"},
        )
        self.check(
            seam.PolicyError,
            [path, "--device", "fake"],
            lambda: seam.open(path, "fake", gguf_prefault="maybe"),
            env={"VT_GGUF_PREFAULT": "maybe"},
        )
        # The process's own variable, read as seam load reads it.
        code = "import seam, sys\ntry:\n    seam.open(sys.argv[1], 'fake')\nexcept seam.PolicyError as e:\n    print(e)\n"
        done = support.child(code, path, env={"VT_PINNED_H2D_LANES": "-1"})
        self.assertEqual(
            f"seam: error: {done.stdout}",
            cli_line(path, "--device", "fake", env={"VT_PINNED_H2D_LANES": "-1"}),
        )

    def test_a_bad_config_raises_policy_error(self):
        path = support.data(QUANT_TYPES)
        for text in ('{"vllm_cpp": {"mmap": {"prefetch": true}}}', "[1, 2]", "{not json"):
            with self.subTest(config=text):
                config = self.write("config.json", text.encode())
                self.check(
                    seam.PolicyError,
                    [path, "--device", "fake", "--config", config],
                    lambda: seam.open(path, "fake", config=config),
                )

    def test_control_bytes_are_escaped_as_the_cli_escapes_them(self):
        path = support.data(QUANT_TYPES)
        # A config path is printed as it is named: raw, but for the escape.
        config = os.path.join(self.dir.name, "\x1b[31mmissing\nconfig.json")
        e = self.check(
            seam.PolicyError,
            [path, "--device", "fake", "--config", config],
            lambda: seam.open(path, "fake", config=config),
        )
        self.assertNotIn("\x1b", str(e))
        self.assertNotIn("\n", str(e))
        self.assertIn("\\u{1b}[31mmissing", str(e))

    def test_a_bad_device_raises_device_error(self):
        path = support.data(QUANT_TYPES)
        for device in ("tpu", "cuda:x", "host:1"):
            with self.subTest(device=device):
                self.check(seam.DeviceError, [path, "--device", device], lambda: seam.open(path, device))


class KindsAndNames(unittest.TestCase):
    def test_every_kind_is_a_seam_error(self):
        kinds = [
            seam.GgufError,
            seam.PolicyError,
            seam.RingError,
            seam.StagingError,
            seam.DeviceError,
            seam.SamplerError,
            seam.PageCacheError,
            seam.ReadError,
        ]
        self.assertEqual(len(set(kinds)), len(kinds))
        for kind in kinds:
            self.assertTrue(issubclass(kind, seam.SeamError), kind)
            self.assertEqual(kind.__module__, "seam")
        self.assertTrue(issubclass(seam.SeamError, Exception))

    def test_unknown_or_repeated_keyword_knobs_are_policy_errors(self):
        path = support.data(QUANT_TYPES)
        with self.assertRaises(seam.PolicyError) as raised:
            seam.open(path, "fake", pinned_h2d_mb=8)
        self.assertIn('unknown knob "pinned_h2d_mb"', str(raised.exception))
        self.assertIn("pinned_h2d_mib", str(raised.exception))
        with self.assertRaises(seam.PolicyError) as raised:
            seam.open(path, "fake", pinned_h2d_mib=8, PINNED_H2D_MIB=8)
        self.assertIn("VT_PINNED_H2D_MIB given twice", str(raised.exception))

    def test_a_name_the_model_lacks_is_a_key_error(self):
        session = seam.open(support.data(QUANT_TYPES), "fake")
        self.assertNotIn("nope", session)
        self.assertIn("t00.f32", session)
        with self.assertRaises(KeyError):
            session.resident("nope")
        with self.assertRaises(KeyError):
            session.tensor("nope")
        with self.assertRaises(KeyError):
            session.stage_all(names=["t00.f32", "nope"])
        self.assertEqual(session.counts["uploads"], 0, "nothing staged before the refusal")


if __name__ == "__main__":
    unittest.main()
