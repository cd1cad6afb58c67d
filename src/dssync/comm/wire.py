"""What travels on the wire: fp32 as kept, or a compressed format with error feedback.

A group average with ``wire="bf16"``, ``"fp16"`` or ``"int8"`` sends each member's buffer
compressed and keeps everything else (the parameters, the sums, the means) in the buffer's own
dtype. ``int8`` is symmetric and scaled per block of :data:`BLOCK` elements (one float32 scale
each), so it moves 1/4 of the fp32 bytes plus 1/256 for the scales.

Error feedback (the role of CHOCO-SGD's public copies, for groups whose members change every
step): each rank keeps a residual ``e`` as large as what it averages. At an averaging it encodes
``v = x + e`` and keeps what the encoding lost, ``e <- v - Q(v)``, for the next averaging. Every
member decodes every member's message, its own included, and all take the mean of the decoded
values in group order, so the members of a group still end with the same bits::

    x_i <- mean_{j in group} Q(x_j + e_j),        e_i <- x_i_old + e_i - Q(x_i_old + e_i)

What remains after an exchange, and why consensus still holds:

* Within the group the members agree exactly (the same decoded inputs, summed in one order).
* ``sum(x) + sum(e)`` over all ranks is unchanged by every averaging (exactly, up to float
  rounding): each member's message is ``x_j + e_j - e_j'``, and the group mean keeps the sum of
  the messages. So the global mean of the parameters drifts from what fp32 averaging would give
  by ``-mean(e)``, which never grows: each ``|e|`` is one encoding's error, at most half an int8
  step (``max|v| / 254`` of its block) or half a bf16/fp16 unit in the last place of ``v``.
  A group of three or more encodes its mean once more (:mod:`dssync.comm.transport`, two
  stages) and the owner of each share keeps ``k`` times that second error in its residual for
  it, so there the drift is at most one more encoding's error of the mean per coordinate.
  What one averaging loses is sent again at the next, so errors do not accumulate.
* Disagreement between groups shrinks as with fp32 (the same doubly stochastic mixing of the
  messages); each averaging perturbs the messages by at most one encoding's error, so the
  consensus distance shrinks to a floor of about that size, not to zero.

The residuals are part of the training state: :class:`Residuals` has ``state_dict`` and
``load_state_dict`` so that a resumed run continues bit for bit.

Example::

    >>> import torch
    >>> codec = codec_for("int8")
    >>> x = torch.linspace(-1, 1, 5)
    >>> codec.decode(codec.encode(x), x.numel(), x.dtype)
    tensor([-1.0000, -0.5039,  0.0000,  0.5039,  1.0000])
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from dssync.errors import UsageError

WIRES = ("fp32", "bf16", "fp16", "int8")
BLOCK = 1024  # elements per int8 scale


class Codec:
    """How one wire format encodes a flat buffer into the tensors that travel, and back."""

    name = "fp32"

    def encode(self, v: torch.Tensor) -> list[torch.Tensor]:
        return [v]

    def decode(self, msg: list[torch.Tensor], numel: int, dtype: torch.dtype) -> torch.Tensor:
        return msg[0].to(dtype)

    def encode_decoded(self, v: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The message of ``v`` (sharing no memory with it) and what every peer decodes from it."""
        msg = detached(self, v)
        return msg, self.decode(msg, v.numel(), v.dtype)

    def empty(self, numel: int, like: torch.Tensor) -> list[torch.Tensor]:
        """Receive buffers for a peer's message of a buffer of ``numel`` elements."""
        return [torch.empty(numel, dtype=like.dtype, device=like.device)]

    def nbytes(self, numel: int) -> int:
        """Bytes one message of ``numel`` float32 elements puts on the wire."""
        return 4 * numel


class Cast(Codec):
    """bf16 or fp16: each element rounded to the half-width float (fp16 clamped to its range)."""

    def __init__(self, name: str, dtype: torch.dtype) -> None:
        self.name, self.dtype = name, dtype

    def encode(self, v: torch.Tensor) -> list[torch.Tensor]:
        if self.dtype == torch.float16:
            top = torch.finfo(torch.float16).max
            v = v.clamp(-top, top)  # beyond it fp16 has only inf; the residual keeps the rest
        return [v.to(self.dtype)]

    def empty(self, numel: int, like: torch.Tensor) -> list[torch.Tensor]:
        return [torch.empty(numel, dtype=self.dtype, device=like.device)]

    def nbytes(self, numel: int) -> int:
        return 2 * numel


class Int8(Codec):
    """Symmetric int8 with one float32 scale per :data:`BLOCK` elements (``max|v| / 127``).

    A message is one int8 tensor: the values, then the scales' bytes. One tensor, in int8 only,
    made on the parameters' device: a backend that takes training data only (nccl) takes it,
    and a pair's message is one send.
    """

    name = "int8"

    def encode(self, v: torch.Tensor) -> list[torch.Tensor]:
        return self.encode_decoded(v)[0]

    def encode_decoded(self, v: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The message and its decoded value in one go: the rounded quotients, kept as floats,
        times the scales are what :meth:`decode` gives (the same bits: they are whole numbers
        within int8's range, once -0.0 is made 0.0), so the int8 values are not cast back."""
        dtype, v = v.dtype, v.float()
        full, n = v.numel() // BLOCK, _blocks(v.numel())
        msg = torch.empty(n * (BLOCK + 4), dtype=torch.int8, device=v.device)
        q, scale = _unpacked(msg)
        parts = [(v[: full * BLOCK].view(full, BLOCK), slice(0, full))] if full else []
        if n > full:  # only the last block is padded (a copy of it, not of the buffer)
            tail = v[full * BLOCK :]
            parts.append((F.pad(tail, (0, BLOCK - tail.numel())).view(1, BLOCK), slice(full, n)))
        for rows, at in parts:  # max |v| without a temporary |v|: max(amax, -amin)
            torch.maximum(rows.amax(dim=1), rows.amin(dim=1).neg_(), out=scale[at])
        scale.div_(127.0).masked_fill_(scale == 0, 1.0)
        steps = torch.empty(n, BLOCK, device=v.device)  # |v| / scale <= 127: no clamp needed
        for rows, at in parts:
            torch.div(rows, scale[at, None], out=steps[at]).round_()
        q.view(n, BLOCK).copy_(steps)
        # + 0.0 turns the -0.0 that rounding a small negative gives into the 0.0 a peer decodes
        mine = steps.mul_(scale[:, None]).add_(0.0).view(-1)[: v.numel()]
        return [msg], mine.to(dtype)

    def decode(self, msg: list[torch.Tensor], numel: int, dtype: torch.dtype) -> torch.Tensor:
        q, scale = _unpacked(msg[0])
        # a cast, then a float multiply: the same bits as int8 * float32 in one mixed-dtype
        # kernel, which took 3-17 ms against 0.6-0.75 ms (4M elements, one thread;
        # tools/codec_cost.py)
        rows = q.view(-1, BLOCK).to(torch.float32).mul_(scale[:, None])
        return rows.reshape(-1)[:numel].to(dtype)

    def empty(self, numel: int, like: torch.Tensor) -> list[torch.Tensor]:
        return [torch.empty(_blocks(numel) * (BLOCK + 4), dtype=torch.int8, device=like.device)]

    def nbytes(self, numel: int) -> int:
        return _blocks(numel) * (BLOCK + 4)


def _unpacked(msg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An int8 message's values and its scales (a float32 view of its tail; no copy)."""
    n = msg.numel() // (BLOCK + 4)
    return msg[: n * BLOCK], msg[n * BLOCK :].view(torch.float32)


def _blocks(numel: int) -> int:
    return -(-numel // BLOCK)


def shares(numel: int, k: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` of each of ``k`` members' shares of a buffer of ``numel`` elements: whole
    blocks of :data:`BLOCK`, as even as they go (a share is empty when blocks are fewer than k).

    Example::

        >>> shares(3 * BLOCK + 5, 2)
        [(0, 2048), (2048, 3077)]
    """
    per, extra = divmod(_blocks(numel), k)
    cuts, row = [], 0
    for j in range(k):
        end = row + per + (1 if j < extra else 0)
        cuts.append((min(row * BLOCK, numel), min(end * BLOCK, numel)))
        row = end
    return cuts


def codec_for(wire: str) -> Codec:
    """The codec of a wire format name; a name not in :data:`WIRES` is refused with the list."""
    codecs = {
        "fp32": Codec(),
        "bf16": Cast("bf16", torch.bfloat16),
        "fp16": Cast("fp16", torch.float16),
        "int8": Int8(),
    }
    if wire not in codecs:
        raise UsageError(f"wire={wire!r} is not a wire format; choose one of {', '.join(WIRES)}")
    return codecs[wire]


# What a quantity whose range int8's per-block scale cannot keep travels in on each wire
# (optimizer state such as Adam's second moment, spanning many orders of magnitude: scaled by
# its block's largest value it rounds to zero or below, and Adam divides by its square root).
# bf16 keeps float32's exponent; fp16's smallest normal (6e-5) is above a second moment's
# usual values, so fp16 sends them as bf16 too. Measured: tests/strategies/test_ranged_state.py.
RANGED = {"fp32": "fp32", "bf16": "bf16", "fp16": "bf16", "int8": "bf16"}


def ranged_codec(wire: str) -> Codec:
    """The codec that carries, on ``wire``, values spanning many orders of magnitude."""
    return codec_for(RANGED[codec_for(wire).name])


class Residuals:
    """Each averaged buffer's error memory: what the last encoding of it lost.

    Kept per position in the list of buffers averaged (flat buckets, then packed optimizer
    state), full size, in the buffer's dtype and device. When the list's shapes change (for
    example once an optimizer has made its momentum) the memory starts again from zero.
    """

    def __init__(self) -> None:
        self.tensors: list[torch.Tensor] = []

    def like(self, buffers: list[torch.Tensor]) -> list[torch.Tensor]:
        """The residuals for ``buffers`` (made as zeros when their shapes changed)."""
        if [t.device for t in self.tensors] != [b.device for b in buffers] and [
            t.numel() for t in self.tensors
        ] == [b.numel() for b in buffers]:
            self.tensors = [t.to(b.device) for t, b in zip(self.tensors, buffers, strict=True)]
        shapes = [(b.numel(), b.dtype, b.device) for b in buffers]
        if [(t.numel(), t.dtype, t.device) for t in self.tensors] != shapes:
            if any(bool(t.any()) for t in self.tensors):
                warnings.warn(
                    "the averaged buffers changed shape (another bucket_bytes, optimizer state "
                    "made or dropped, or a checkpoint of another model): the wire's error "
                    "memory starts again from zero, so what the last encodings lost is dropped",
                    stacklevel=4,
                )
            self.tensors = [torch.zeros_like(b) for b in buffers]
        return self.tensors

    def state_dict(self) -> dict:
        return {"residuals": [t.clone() for t in self.tensors]}

    def load_state_dict(self, state: dict) -> None:
        self.tensors = [t.clone() for t in state.get("residuals", [])]


def encode_with_feedback(
    codec: Codec, buffer: torch.Tensor, residual: torch.Tensor
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Encode ``buffer + residual``; keep what was lost in ``residual`` (in place).

    Returns the message and its decoded value (what every peer will decode from it).
    """
    v = residual.add_(buffer)  # buffer + residual, formed in the residual's own memory
    msg, mine = codec.encode_decoded(v)  # shares no memory with v, which changes below
    residual.sub_(mine)
    return msg, mine


def detached(codec: Codec, v: torch.Tensor) -> list[torch.Tensor]:
    """``codec.encode(v)`` sharing no memory with ``v``: a format that keeps the buffer's dtype
    may hand back ``v`` itself, which is copied; a fresh message is not."""
    return [
        m.clone() if m.untyped_storage().data_ptr() == v.untyped_storage().data_ptr() else m
        for m in codec.encode(v)
    ]


def mean_in_order(values: list[torch.Tensor], out: torch.Tensor | None = None) -> torch.Tensor:
    """The mean of ``values`` summed in the order given (members sum alike: the same bits).

    With ``out`` the mean is written there with no temporary (one add per value, one divide);
    ``out`` may be ``values[0]`` or ``values[1]``, else it must share no memory with any value.
    """
    if len(values) == 1:
        total = values[0].clone() if out is None else out.copy_(values[0])
    else:
        total = (
            torch.add(values[0], values[1], out=out) if out is not None else values[0] + values[1]
        )
        for v in values[2:]:
            total.add_(v)
    return total.div_(len(values))
