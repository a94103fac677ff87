"""`Session.resident` and `Session.stage_all`: each tensor is staged once
per session whichever asks first; `stage_all` reports progress per tensor,
stops on the callback's exception and raises it; `names` stages only
those."""

import unittest

import numpy as np

import seam
import support

QUANT_TYPES = "interop/quant_types.gguf"


class Planted(Exception):
    pass


class Staging(unittest.TestCase):
    def setUp(self):
        self.path = support.data(QUANT_TYPES)

    def test_progress_names_each_tensor_once_and_counts_its_bytes(self):
        session = seam.open(self.path, "fake")
        calls = []
        staged = session.stage_all(progress=lambda name, done, total: calls.append((name, done, total)))
        total = sum(t.n_bytes for t in session)
        self.assertEqual(sorted(c[0] for c in calls), sorted(t.name for t in session))
        self.assertEqual([c[2] for c in calls], [total] * len(calls))
        self.assertEqual(sorted(c[1] for c in calls)[-1], total)
        self.assertEqual(len({c[1] for c in calls}), len(calls), "done grows with every tensor")
        self.assertEqual(len(staged), len(session))
        self.assertEqual(session.counts["uploads"], len(session))

    def test_an_exception_of_progress_stops_the_load_and_is_raised(self):
        session = seam.open(self.path, "fake", pinned_h2d_mib=0)

        def progress(name, done, total):
            raise Planted(name)

        with self.assertRaises(Planted):
            session.stage_all(progress=progress)
        # One worker without a ring: it stopped after the first tensor.
        self.assertEqual(session.counts["uploads"], 1)

    def test_a_tensor_is_staged_once_whichever_asks_first(self):
        session = seam.open(self.path, "fake")
        first = session.resident("t09.q4_k")
        self.assertEqual(session.counts["uploads"], 1)
        again = session.resident("t09.q4_k")
        self.assertEqual(session.counts["uploads"], 1)
        staged = {t.name: t for t in session.stage_all()}
        self.assertEqual(session.counts["uploads"], len(session), "not staged twice")
        address = np.from_dlpack(first).ctypes.data
        self.assertEqual(np.from_dlpack(again).ctypes.data, address)
        self.assertEqual(np.from_dlpack(staged["t09.q4_k"]).ctypes.data, address)
        session.stage_all()
        self.assertEqual(session.counts["uploads"], len(session))

    def test_names_stage_only_those(self):
        session = seam.open(self.path, "fake")
        staged = session.stage_all(names=["t25.f64", "t00.f32"])
        self.assertEqual([t.name for t in staged], ["t00.f32", "t25.f64"], "table order")
        self.assertEqual(session.counts["uploads"], 2)
        self.assertEqual(session.counts["uploaded_bytes"], sum(t.n_bytes for t in staged))

    def test_the_host_stages_nothing(self):
        session = seam.open(self.path, "host")
        session.stage_all()
        self.assertEqual(session.counts["uploads"], 0)
        self.assertEqual(session.resident("t00.f32").device, "host")


if __name__ == "__main__":
    unittest.main()
