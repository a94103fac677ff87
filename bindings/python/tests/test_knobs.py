"""Keyword knobs are the environment layer of the seam's own resolution:
a keyword is read as its `VT_*` variable (over the process's variable of
that name), before the config file, before the device default; the
resolved line is the one `seam load` prints for the same settings."""

import json
import os
import tempfile
import unittest

import seam
import support

QUANT_TYPES = "interop/quant_types.gguf"


def policy_of(line, knob):
    """`value (source)` of `knob` in a policy line."""
    for part in line.replace(";", ",").split(","):
        part = part.strip()
        if part.startswith("policy: ") or part.startswith("ring: "):
            part = part.split(": ", 1)[1]
        name, _, rest = part.partition("=")
        if name == knob:
            return rest
    raise AssertionError(f"{knob} not in {line!r}")


class KeywordKnobs(unittest.TestCase):
    def setUp(self):
        self.path = support.data(QUANT_TYPES)
        self.dir = tempfile.TemporaryDirectory()
        self.config = os.path.join(self.dir.name, "config.json")
        with open(self.config, "w") as f:
            json.dump({"vllm_cpp": {"pinned_h2d": {"mib": 5}, "mmap": {"prefault": True}}}, f)

    def tearDown(self):
        self.dir.cleanup()

    def line(self, **kwargs):
        return seam.open(self.path, "fake", **kwargs).policy_line

    def test_a_keyword_is_its_environment_variable(self):
        self.assertEqual(policy_of(self.line(), "pinned_h2d_mib"), "64 (built-in default)")
        self.assertEqual(policy_of(self.line(pinned_h2d_mib=2), "pinned_h2d_mib"), "2 (env VT_PINNED_H2D_MIB)")
        self.assertEqual(policy_of(self.line(PINNED_H2D_MIB=3), "pinned_h2d_mib"), "3 (env VT_PINNED_H2D_MIB)")
        self.assertEqual(policy_of(self.line(gguf_prefault=True), "prefault"), "on (env VT_GGUF_PREFAULT)")
        self.assertEqual(policy_of(self.line(gguf_prefault=False), "prefault"), "off (env VT_GGUF_PREFAULT)")
        self.assertEqual(policy_of(self.line(gguf_direct_io="on"), "direct_io"), "on (env VT_GGUF_DIRECT_IO)")
        self.assertEqual(policy_of(self.line(pinned_h2d_mib=None), "pinned_h2d_mib"), "64 (built-in default)")

    def test_env_over_config_over_default(self):
        line = self.line(config=self.config)
        self.assertEqual(policy_of(line, "pinned_h2d_mib"), "5 (config vllm_cpp.pinned_h2d.mib)")
        self.assertEqual(policy_of(line, "prefault"), "on (config vllm_cpp.mmap.prefault)")
        line = self.line(config=self.config, pinned_h2d_mib=2)
        self.assertEqual(policy_of(line, "pinned_h2d_mib"), "2 (env VT_PINNED_H2D_MIB)")
        self.assertEqual(policy_of(line, "prefault"), "on (config vllm_cpp.mmap.prefault)")

    def test_the_process_environment_counts_and_a_keyword_overrides_it(self):
        code = (
            "import json, seam, sys\n"
            "kw = json.loads(sys.argv[2])\n"
            "print(json.dumps(seam.open(sys.argv[1], 'fake', **kw).policy_line))\n"
        )
        env = {"VT_PINNED_H2D_MIB": "3"}
        for kwargs, expected in [
            ({}, "3 (env VT_PINNED_H2D_MIB)"),
            ({"pinned_h2d_mib": 2}, "2 (env VT_PINNED_H2D_MIB)"),
            ({"pinned_h2d_mib": None}, "3 (env VT_PINNED_H2D_MIB)"),
        ]:
            with self.subTest(kwargs=kwargs):
                line = support.child_json(self, code, self.path, json.dumps(kwargs), env=env)
                self.assertEqual(policy_of(line, "pinned_h2d_mib"), expected)

    def test_the_line_is_the_one_seam_load_prints(self):
        done = support.seam(
            "load", self.path, "--device", "fake", "--config", self.config,
            env={"VT_PINNED_H2D_BUFFERS": "3", "VT_GGUF_DROP_PAGE_CACHE": "off"},
        )
        self.assertEqual(done.returncode, 0, done.stderr)
        cli = [l for l in done.stderr.splitlines() if l.startswith("seam: policy: ")]
        self.assertEqual(len(cli), 1, done.stderr)
        line = self.line(config=self.config, pinned_h2d_buffers=3, gguf_drop_page_cache=False)
        self.assertEqual(f"seam: {line}", cli[0])

    def test_knob_names_cover_every_variable(self):
        names = dict(seam.knob_names())
        self.assertEqual(names["pinned_h2d_mib"], "VT_PINNED_H2D_MIB")
        self.assertEqual(names["gguf_prefault"], "VT_GGUF_PREFAULT")
        self.assertTrue(all(v == "VT_" + k.upper() for k, v in names.items()), names)
        self.assertGreaterEqual(len(names), 14)


if __name__ == "__main__":
    unittest.main()
