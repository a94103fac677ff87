"""seam for Python engines: stage a GGUF model's weights onto a device once,
give the host's pages back, and hand the staged bytes to PyTorch or NumPy
without a copy (DLPack).

    import seam, torch
    session = seam.open("model.gguf", "cuda:0")          # knobs: pinned_h2d_mib=8, ...
    for t in session.stage_all():                        # in parallel over the ring's lanes
        w = torch.from_dlpack(t)                         # on cuda:0, no copy

    for name, tensor in seam.gguf_weights_iterator("model.gguf", "cuda:0"):
        ...                                              # what vLLM's GGUF iterator yields

`open`, `Session`, `Tensor`, `TensorInfo` and the exception classes are the
native module's (`seam._seam`); `gguf_weights_iterator` is written here on
top of them.
"""

from ._seam import (
    DeviceError,
    GgufError,
    PageCacheError,
    PolicyError,
    ReadError,
    RingError,
    SamplerError,
    SeamError,
    Session,
    StagingError,
    Tensor,
    TensorInfo,
    knob_names,
    open,
    reset_peak,
    residency,
)

__all__ = [
    "DeviceError",
    "GgufError",
    "PageCacheError",
    "PolicyError",
    "ReadError",
    "RingError",
    "SamplerError",
    "SeamError",
    "Session",
    "StagingError",
    "Tensor",
    "TensorInfo",
    "gguf_weights_iterator",
    "knob_names",
    "open",
    "reset_peak",
    "residency",
]

# The types vLLM's GGUF loader takes as they are; every other type comes
# with a `qweight_type` entry and its data named `qweight`.
_UNQUANTIZED = ("F32", "BF16", "F16")


def _framework(framework):
    """(from_dlpack, the type-id tensor maker, whether bfloat16 exists)."""
    if framework == "torch":
        import torch

        return torch.from_dlpack, lambda type_id: torch.tensor(type_id), True
    if framework == "numpy":
        import numpy

        return numpy.from_dlpack, lambda type_id: numpy.array(type_id, dtype=numpy.int64), False
    raise ValueError(f"framework must be 'torch' or 'numpy', not {framework!r}")


def _data(tensor, from_dlpack, has_bfloat16):
    """The staged tensor as gguf-py's reader shapes it (vLLM's data)."""
    shape = list(tensor.gguf_py_shape)
    if tensor.dtype == "bfloat16" and not has_bfloat16:
        # gguf-py's own view of BF16: its bytes, rows of 2 per element.
        shape[-1] *= 2
        data = from_dlpack(tensor.raw())
    else:
        data = from_dlpack(tensor)
    if tuple(data.shape) != tuple(shape):
        data = data.reshape(shape)
    return data


def gguf_weights_iterator(
    path,
    device=None,
    gguf_to_hf_name_map=None,
    *,
    framework="torch",
    progress=None,
    config=None,
    **knobs,
):
    """Yield ``(name, tensor)`` as vLLM's ``gguf_quant_weights_iterator``
    does, with every tensor staged on ``device`` by the seam.

    A vLLM-style loader switches by replacing one call::

        gguf_quant_weights_iterator(path, name_map)
        seam.gguf_weights_iterator(path, "cuda:0", name_map)

    As vLLM's: with a name map, only its tensors, under their mapped names
    (``None``: every tensor under its GGUF name); first, for each tensor of
    a type other than F32, BF16 and F16, ``(name with "weight" ->
    "qweight_type", a 0-d int64 tensor of its ggml type id)`` on the CPU;
    then each tensor's data, named ``"qweight"`` for those types, shaped as
    gguf-py's reader shapes it (row-major dims; a block type as ``uint8``
    rows of its bytes; BF16 as bfloat16). Unlike vLLM's, the data is
    already on ``device`` (a view of the staged copy, not a host copy
    ``torch.tensor`` made), every tensor staged before the first is
    yielded (``Session.stage_all``, in parallel; ``progress`` as there).

    ``framework="numpy"`` yields NumPy arrays instead (host, fake device;
    BF16 as gguf-py's reader gives it, ``uint8``, NumPy having no
    bfloat16); ``config`` and the keyword knobs are ``seam.open``'s.
    """
    from_dlpack, type_tensor, has_bfloat16 = _framework(framework)
    session = open(path, device, config=config, **knobs)
    if gguf_to_hf_name_map is None:
        mapped = {t.name: t.name for t in session}
    else:
        mapped = {t.name: gguf_to_hf_name_map[t.name] for t in session if t.name in gguf_to_hf_name_map}
    staged = session.stage_all(progress=progress, names=list(mapped))
    for t in staged:
        if t.ggml_type not in _UNQUANTIZED:
            yield mapped[t.name].replace("weight", "qweight_type"), type_tensor(t.ggml_type_id)
    for t in staged:
        name = mapped[t.name]
        if t.ggml_type not in _UNQUANTIZED:
            name = name.replace("weight", "qweight")
        yield name, _data(t, from_dlpack, has_bfloat16)
