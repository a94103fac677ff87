"""What the package's tests share: their inputs, named by the environment
`cargo xtask test` sets (the `seam` binary, the committed test data, the
gemma file, a generated model), the `seam` command, and child processes.

A missing input fails the test that needs it (run the tests through
`cargo xtask test`); nothing is skipped.
"""

import functools
import json
import os
import subprocess
import sys


def required(name):
    """The value of the environment variable `name`, which must be set."""
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"{name} is not set: run these tests through `cargo xtask test`")
    return value


def data(relative):
    """A file of the committed test data (`tests/data/RELATIVE`)."""
    return os.path.join(required("SEAM_TEST_DATA"), relative)


def gemma():
    """The real gemma-3-270m Q4_K_M file."""
    return required("SEAM_GEMMA_GGUF")


def generated():
    """A generated model (256 MiB, mixed types) for the residency test."""
    return required("SEAM_GENERATED_GGUF")


def seam(*args, env=None):
    """Runs the `seam` binary; its completed process (text)."""
    merged = dict(os.environ)
    merged.update(env or {})
    return subprocess.run(
        [required("SEAM_BIN"), *map(str, args)],
        capture_output=True,
        text=True,
        env=merged,
        timeout=300,
    )


@functools.lru_cache(maxsize=None)
def inspect(path):
    """`seam inspect PATH --json --hash` (once per path and process: the
    caller must not change what it returns)."""
    done = seam("inspect", path, "--json", "--hash")
    if done.returncode != 0:
        raise AssertionError(f"seam inspect {path} failed: {done.stderr}")
    return json.loads(done.stdout)


def child(code, *args, env=None):
    """Runs `code` in a fresh Python (this interpreter) with `args` as
    sys.argv[1:]; its completed process (text)."""
    merged = dict(os.environ)
    merged.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        capture_output=True,
        text=True,
        env=merged,
        timeout=600,
    )


def child_json(test, code, *args, env=None):
    """`child`, which must exit 0 and print one JSON value last."""
    done = child(code, *args, env=env)
    test.assertEqual(done.returncode, 0, f"child failed:\n{done.stdout}\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])
