"""suite/numerics/e4m3.py: the fast decode and the one-pass round trip give torch's numbers, bit for
bit, in the layout the GEMMs always read."""

import pytest
import torch

from suite.numerics import e4m3
from suite.numerics.e4m3 import DECODE_SHIFT, FP8, SMALL


def _codes(n: int) -> torch.Tensor:
    """Every one of the 256 E4M3 codes but the two NaNs, repeated to n (the fast path's size)."""
    c = torch.arange(256, dtype=torch.uint8)
    c = c[(c & 0x7F) != 0x7F]
    return c.repeat(-(-n // c.numel()))[:n].view(FP8)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)  # -0.0 and 0.0 differ here, as they do in torch's cast


@pytest.mark.parametrize("n", [SMALL - 1, SMALL, 3 * SMALL])
def test_decoded_is_torchs_cast_over_256_for_every_code(n):
    q = _codes(n)
    assert torch.equal(_bits(e4m3.decoded(q) * DECODE_SHIFT), _bits(q.float()))


def test_decoded_keeps_strides_and_a_nan_code_takes_torchs_cast():
    q = _codes(4 * SMALL).reshape(256, -1).t()  # a transposed view
    got = e4m3.decoded(q)
    assert got.stride() == q.float().stride() and torch.equal(_bits(got * 256), _bits(q.float()))
    q = q.contiguous().view(torch.uint8).clone()
    q[3, 5], q[7, 1] = 0x7F, 0xFF  # +NaN, -NaN: the fp16 pattern would read them as +-480
    got = e4m3.decoded(q.view(FP8))
    assert got.isnan().sum() == 2 and got[3, 5].isnan() and got[7, 1].isnan()


@pytest.mark.parametrize("shape,dim", [((300, 96), -1), ((300, 200), -1), ((300, 256), -1),
                                       ((100, 64), 0), ((300, 64), 0), ((2, 37, 96), -1)])
def test_round_trip_is_quantise_then_dequantise_in_the_padded_layout(shape, dim):
    torch.manual_seed(0)
    x = torch.randn(shape) * torch.logspace(-30, 30, shape[-1])  # normals, subnormals, saturation
    x[0] = 0.0  # an all-zero group: scale 1
    q, s, x_hat = e4m3.quantized(x, dim, 128, dequantize=True)
    want = e4m3.dequantized(q, s, dim, 128)
    for got in (x_hat, e4m3.round_trip(x, dim, 128)):
        assert torch.equal(_bits(got), _bits(want)) and got.stride() == want.stride()
    # torch's own cast, padded to whole groups of 128: the values and strides before the fast path
    L = x.shape[dim]
    pad = -L % 128
    xp = torch.nn.functional.pad(x.movedim(dim, -1), (0, pad)).movedim(-1, dim)
    tiles = xp.reshape(*xp.shape[:dim % x.dim()], -1, 128, *xp.shape[dim % x.dim() + 1:])
    gdim = dim % x.dim() + 1
    sc = e4m3.scale_from_amax(tiles.abs().amax(dim=gdim, keepdim=True))
    ref = ((tiles / sc).clamp(-448, 448).to(FP8).float() * sc).reshape(xp.shape)
    ref = ref.narrow(dim, 0, L)
    # the layout the padded tiles gave: a last dim in rows of whole groups, else dense
    last = dim % x.dim() == x.dim() - 1
    layout = torch.empty(*x.shape[:-1], L + pad)[..., :L] if last else torch.empty(x.shape)
    assert torch.equal(_bits(want), _bits(ref.contiguous())) and want.stride() == layout.stride()
