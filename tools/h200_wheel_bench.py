#!/usr/bin/env python3
"""The issue-30 run on the H200 machine: the generated 32 GiB model loaded
into PyTorch tensors on a GPU through the `seam` wheel, and through the
vLLM GGUF path (gguf-py's reader, `torch.tensor(...)`, `.to("cuda")`), each
in its own child process, in one run:

- GB/s of each (tensor bytes over the wall time from before the reader is
  opened until every tensor is on the GPU and the device is synchronized),
- host growth of each (VmHWM after the load over VmRSS before it, the peak
  reset after torch's CUDA context exists), the seam's against its ring,
- every tensor equal: after its measurement the gguf-py child loads the
  file through the wheel as well and compares every yielded (name, tensor)
  with its own on the GPU, byte for byte (names and order, dtype, shape).

It needs, in the carried folder (`tools/h200_wheel_pack.sh DIR` makes it
here): `seam-*.whl` (installed with pip into DIR/site, no index, no
dependencies; if pip refuses the wheel, why is printed and it is unzipped
instead) and `gguf-py.tar.gz` (llama.cpp's gguf-py). A missing model is
written by the wheel itself (`seam._seam._write_generated_model`, byte for
byte what `cargo xtask gen-gguf --size 32GiB --seed 0` writes). The machine
needs Python 3.10+, PyTorch with CUDA and NumPy (gguf-py's reader is
NumPy); nothing is downloaded.

    python3 tools/h200_wheel_bench.py --carry target/h200-wheel \\
        [--model /tmp/m32.gguf] [--device cuda:0] [--out /tmp/o/wheel] [--generate-only]

Prints one JSON summary (also written to OUT/summary.json) and exits 0
when every tensor is equal, the seam's GB/s is at least 10x the gguf-py
path's and its host growth is within its ring plus 64 MiB; 1 otherwise.
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import tarfile
import time
import zipfile

MIB = 1 << 20

# What both children do first: PyTorch's CUDA context made before the
# measurement (it costs the host hundreds of MiB either way), then the peak
# reset, the baseline read.
PRELUDE = r"""
import json, os, sys, time
sys.path[:0] = json.loads(os.environ["WHEEL_BENCH_PATHS"])
import torch

def status():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssFile", "RssAnon"):
                out[key] = int(value.split()[0]) * 1024
    return out

device = sys.argv[2]
# The fake device and the host (a dry run without a GPU) are CPU tensors.
torch_device = "cpu" if device in ("fake", "host") else device
def synchronize():
    if torch_device != "cpu":
        torch.cuda.synchronize(torch_device)
torch.zeros(1, device=torch_device)
synchronize()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = status()
"""

# The seam: its vLLM-shaped iterator, every tensor kept (as a loader keeps
# its parameters) on the GPU.
SEAM_CHILD = PRELUDE + r"""
import seam
path = sys.argv[1]
start = time.perf_counter()
tensors = {}
for name, tensor in seam.gguf_weights_iterator(path, device):
    tensors[name] = tensor
synchronize()
seconds = time.perf_counter() - start
after = status()
session = seam.open(path, device)
print(json.dumps({
    "path": "seam",
    "seconds": seconds,
    "bytes": sum(t.numel() * t.element_size() for n, t in tensors.items() if not n.endswith("qweight_type")),
    "entries": len(tensors),
    "on_device": all(t.device == torch.device(torch_device) for n, t in tensors.items() if not n.endswith("qweight_type")),
    "before": before,
    "after": after,
    "policy_line": session.policy_line,
    "torch": torch.__version__,
    "seam_file": seam.__file__,
}))
"""

# vLLM's GGUF path: `gguf_quant_weights_iterator` (gguf-py's reader,
# `torch.tensor` of each tensor's data) and the loader's copy to the GPU.
# Then, unmeasured, the same file through the wheel, compared.
GGUF_PY_CHILD = PRELUDE + r"""
import numpy as np
try:
    import yaml  # noqa: F401  (gguf-py's metadata module imports it)
except ImportError:
    import types
    sys.modules["yaml"] = types.ModuleType("yaml")
import gguf

def vllm_gguf_quant_weights_iterator(gguf_file):
    reader = gguf.GGUFReader(gguf_file)
    for tensor in reader.tensors:
        if tensor.tensor_type.name not in ("F32", "BF16", "F16"):
            yield tensor.name.replace("weight", "qweight_type"), torch.tensor(tensor.tensor_type)
    for tensor in reader.tensors:
        weight = tensor.data
        name = tensor.name
        if tensor.tensor_type.name not in ("F32", "BF16", "F16"):
            name = name.replace("weight", "qweight")
        if tensor.tensor_type.name == "BF16" and weight.dtype == np.uint8:
            param = torch.tensor(weight.view(np.uint16)).view(torch.bfloat16)
        else:
            param = torch.tensor(weight)
        yield name, param

path = sys.argv[1]
start = time.perf_counter()
tensors = {}
for name, tensor in vllm_gguf_quant_weights_iterator(path):
    tensors[name] = tensor if name.endswith("qweight_type") else tensor.to(torch_device)
synchronize()
seconds = time.perf_counter() - start
after = status()

import seam
names_ours = []
unequal = []
for name, ours in seam.gguf_weights_iterator(path, device):
    names_ours.append(name)
    theirs = tensors.get(name)
    if theirs is None:
        unequal.append([name, "missing from the gguf-py path"])
    elif ours.dtype != theirs.dtype or tuple(ours.shape) != tuple(theirs.shape):
        unequal.append([name, f"{ours.dtype}{tuple(ours.shape)} vs {theirs.dtype}{tuple(theirs.shape)}"])
    elif ours.dim() == 0:
        if int(ours) != int(theirs):
            unequal.append([name, f"type {int(ours)} vs {int(theirs)}"])
    elif ours.device != theirs.device:
        unequal.append([name, f"on {ours.device}, the gguf-py one on {theirs.device}"])
    elif not torch.equal(ours.reshape(-1).view(torch.uint8), theirs.reshape(-1).view(torch.uint8)):
        unequal.append([name, "bytes differ"])
    del ours
print(json.dumps({
    "path": "gguf-py",
    "seconds": seconds,
    "bytes": sum(t.numel() * t.element_size() for n, t in tensors.items() if not n.endswith("qweight_type")),
    "entries": len(tensors),
    "before": before,
    "after": after,
    "names_equal": names_ours == list(tensors),
    "unequal": unequal[:20],
    "n_unequal": len(unequal),
    "gguf_py": gguf.__file__,
    "numpy": np.__version__,
}))
"""


def say(*args):
    print(*args, file=sys.stderr, flush=True)


def install(carry, paths):
    """Installs the wheel (pip, into CARRY/site) and unpacks gguf-py;
    returns what pip said about the wheel."""
    wheels = sorted(glob.glob(os.path.join(carry, "seam-*.whl")))
    if len(wheels) != 1:
        raise SystemExit(f"{carry}: expected one seam-*.whl, found {wheels}")
    site = os.path.join(carry, "site")
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--upgrade",
         "--target", site, wheels[0]],
        capture_output=True, text=True,
    )
    verdict = {"wheel": os.path.basename(wheels[0]), "pip_rc": pip.returncode,
               "pip_said": (pip.stdout + pip.stderr).strip().splitlines()[-3:]}
    if pip.returncode != 0:
        say(f"pip refused {wheels[0]}: {pip.stderr.strip()}; unzipping it instead")
        with zipfile.ZipFile(wheels[0]) as z:
            z.extractall(site)
    paths.append(site)
    tarball = os.path.join(carry, "gguf-py.tar.gz")
    unpacked = os.path.join(carry, "gguf-py")
    if not os.path.isdir(unpacked):
        with tarfile.open(tarball) as t:
            t.extractall(carry)
    paths.append(unpacked)
    return verdict


def child(code, model, device, paths, limit):
    env = dict(os.environ, WHEEL_BENCH_PATHS=json.dumps(paths))
    done = subprocess.run([sys.executable, "-c", code, model, device], capture_output=True,
                          text=True, env=env, timeout=limit)
    if done.returncode != 0:
        return {"failed": done.returncode, "stderr": done.stderr[-4000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def ring_bytes(policy_line):
    """pinned_h2d_mib x buffers, from the policy line."""
    fields = {}
    for part in policy_line.replace(";", ",").split(","):
        name, _, rest = part.strip().split(": ")[-1].partition("=")
        fields[name] = rest.split()[0] if rest else ""
    return int(fields["pinned_h2d_mib"]) * MIB * int(fields["buffers"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--carry", required=True, help="folder with seam-*.whl and gguf-py.tar.gz")
    ap.add_argument("--model", default="/tmp/m32.gguf")
    ap.add_argument("--size-gib", type=float, default=32, help="generated model size when --model is missing")
    ap.add_argument("--device", default="cuda:0",
                    help="the GPU (fake or host: a dry run on CPU tensors, no GPU needed)")
    ap.add_argument("--out", default="/tmp/o/wheel")
    ap.add_argument("--limit", type=int, default=400, help="seconds per child")
    ap.add_argument("--generate-only", action="store_true",
                    help="install, write the model if missing, and stop (a first device call)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    paths = []
    verdict = install(os.path.abspath(args.carry), paths)
    say(f"{time.time() - t0:.0f}s installed: {verdict}")
    if not os.path.exists(args.model):
        say(f"{time.time() - t0:.0f}s writing the generated model {args.model} ({args.size_gib} GiB)")
        partial = args.model + ".partial"
        write = ("import json, os, sys\n"
                 "sys.path[:0] = json.loads(os.environ['WHEEL_BENCH_PATHS'])\n"
                 "import seam\n"
                 "seam._seam._write_generated_model(sys.argv[1], int(float(sys.argv[2]) * (1 << 30)), 0)\n")
        subprocess.run([sys.executable, "-c", write, partial, str(args.size_gib)], check=True,
                       env=dict(os.environ, WHEEL_BENCH_PATHS=json.dumps(paths)))
        os.rename(partial, args.model)
        os.sync()
    if args.generate_only:
        say(f"{time.time() - t0:.0f}s {args.model}: {os.path.getsize(args.model)} bytes; stopping (--generate-only)")
        return
    say(f"{time.time() - t0:.0f}s seam child")
    ours = child(SEAM_CHILD, args.model, args.device, paths, args.limit)
    say(f"{time.time() - t0:.0f}s gguf-py child")
    theirs = child(GGUF_PY_CHILD, args.model, args.device, paths, args.limit)
    summary = {"install": verdict, "model": args.model, "model_bytes": os.path.getsize(args.model),
               "seam": ours, "gguf_py": theirs}
    ok = "failed" not in ours and "failed" not in theirs
    if ok:
        for side in (ours, theirs):
            side["gbps"] = side["bytes"] / side["seconds"] / 1e9
            side["host_growth_mib"] = (side["after"]["VmHWM"] - side["before"]["VmRSS"]) / MIB
            side["rss_file_after_mib"] = side["after"]["RssFile"] / MIB
        ring = ring_bytes(ours["policy_line"])
        summary["ring_mib"] = ring / MIB
        summary["speedup"] = ours["gbps"] / theirs["gbps"]
        summary["every_tensor_equal"] = theirs["names_equal"] and theirs["n_unequal"] == 0 and ours["entries"] == theirs["entries"]
        summary["growth_within_ring"] = ours["host_growth_mib"] * MIB <= ring + 64 * MIB
        ok = summary["every_tensor_equal"] and summary["speedup"] >= 10 and summary["growth_within_ring"]
    summary["pass"] = ok
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary, indent=1))
    say(f"{time.time() - t0:.0f}s done: {'PASS' if ok else 'FAIL'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
