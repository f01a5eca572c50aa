"""The greedy choice from an output layer's smaller copy (dart_core.greedy_output): always the argmax of the full fp32
layer as our kernel computes it, ties, NaNs and infinities included, from a bf16 or an int8 copy; the bound it rests on
holds; and the verify step that returns it agrees with the logits it replaces."""

from __future__ import annotations

import platform

import pytest
import torch

from dart_core.greedy_output import GreedyOutput
from dart_core.setup.calibration import CopyChoice, copy_choice, greedy_copy_choice, measure_greedy_copy
from dart_core.machine import amx_tiles, few_rows
from dart_core.machine.hardware import detect
from dart_core.setup.tiny_models import tiny_target
from dart_core.tree import TokenTree

HERE = detect()
KERNEL = few_rows.kernel(HERE.kind)
# (the copy, how an int8 copy's product runs): fp32 FMAs, its tiles' integer sums in plain C (on every machine), and
# "auto": on AMX tiles where this machine has them, else by VNNI where it has that, else the FMAs
COPIES = [(torch.bfloat16, "off"), (torch.int8, "off"), (torch.int8, "stand-in"), (torch.int8, "auto")]


def kernel_or_why():
    if KERNEL is None:   # no C compiler: the reason is said, and greedy steps take the full layer
        assert few_rows.why_not(HERE.kind) and not HERE.few_rows
    return KERNEL


def near_ties(gen) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight [300, 64] whose rows 10, 11 and 200 are one row (exact ties) and row 12 that row one ulp off; inputs
    that make them the largest logits, and plain random ones."""
    w = torch.randn(300, 64, generator=gen) * 0.1
    w[11] = w[200] = w[10]
    w[12] = torch.nextafter(w[10], torch.full_like(w[10], 1.0))
    x = torch.randn(12, 64, generator=gen)
    x[:4] = w[10] * 50 + torch.randn(4, 64, generator=gen) * 1e-3
    return w, x


@pytest.mark.parametrize("copy, tiles", COPIES)
def test_the_choice_is_the_full_layers_argmax(copy, tiles):
    kernel = kernel_or_why()
    if kernel is None:
        return
    gen = torch.Generator().manual_seed(0)
    for weight, x in [near_ties(gen), (torch.randn(1000, 96, generator=gen), torch.randn(9, 96, generator=gen) * 3)]:
        out = GreedyOutput(weight, kernel, copy, tiles)
        full = kernel.linear(x, kernel.pack(weight), None)
        candidates = torch.zeros(x.shape[0], dtype=torch.long)
        assert torch.equal(out.choose(x, candidates), full.max(-1).indices)
        assert (candidates >= 1).all() and (candidates <= weight.shape[0]).all()
        for i in range(x.shape[0]):   # a row alone gets what it gets among others
            assert torch.equal(out.choose(x[i:i + 1]), full[i:i + 1].max(-1).indices)
    weight, x = near_ties(gen)
    # the first of the tied rows, or the one an ulp off
    assert int(GreedyOutput(weight, kernel, copy, tiles).choose(x[:1])) in (10, 12)


def test_a_bf16_layer_chooses_as_its_bf16_product_does():
    """A bf16 model's output layer (its weight read in place): the int8 copy's choice is the argmax of the product
    of the bf16 weights, ties included."""
    kernel = kernel_or_why()
    if kernel is None:
        return
    gen = torch.Generator().manual_seed(3)
    weight, x = near_ties(gen)
    weight = weight.bfloat16()
    full = kernel.linear(x, kernel.pack(weight, torch.bfloat16), None)
    for tiles in ("off", "stand-in", "auto"):
        out = GreedyOutput(weight, kernel, torch.int8, tiles)
        assert out.weight.data_ptr() == weight.data_ptr()   # no fp32 copy of a bf16 weight
        assert torch.equal(out.choose(x), full.max(-1).indices)
    with pytest.raises(ValueError, match="bf16 or int8"):
        GreedyOutput(weight, kernel, torch.float32)


@pytest.mark.parametrize("copy, tiles", COPIES)
def test_nans_and_infinities_choose_as_torch_does(copy, tiles):
    kernel = kernel_or_why()
    if kernel is None:
        return
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(200, 32, generator=gen)
    weight[150, 3] = float("nan")
    x = torch.randn(3, 32, generator=gen)
    x[1, 0] = float("inf")
    x[2] = 0.0
    x[2, 3] = 1.0   # reaches the NaN weight
    out = GreedyOutput(weight, kernel, copy, tiles)
    full = kernel.linear(x, kernel.pack(weight), None)
    assert torch.equal(out.choose(x), full.max(-1).indices)


@pytest.mark.parametrize("copy, tiles", COPIES)
def test_the_bound_holds_for_every_output(copy, tiles):
    """|exact - approximate| <= |x|_2 * bound_j (+ the tiles' widening): what the choice's exactness rests on. The
    inputs have an outlier, which makes the tiles' digits coarse."""
    kernel = kernel_or_why()
    if kernel is None:
        return
    gen = torch.Generator().manual_seed(2)
    weight = torch.randn(500, 128, generator=gen) * torch.rand(500, 1, generator=gen)
    out = GreedyOutput(weight, kernel, copy, tiles)
    x = torch.randn(16, 128, generator=gen) * 10
    x[:4, 7] = 3e4
    exact = kernel.linear(x, kernel.pack(weight), None).double()
    approx, widened = approximate_logits(out, x)
    limit = x.double().norm(dim=1, keepdim=True) * out.bound.double() + widened.double()[:, None]
    assert ((exact - approx.double()).abs() <= limit).all()
    assert (out.bound > 0).all() and bool((limit > (exact - approx.double()).abs() * 1.01).any())
    if out.tiles is not None:   # the digits' error counts: without it the bound would not hold for these rows
        assert (widened[:4] > 0).all()


def approximate_logits(out: GreedyOutput, x: torch.Tensor,
                       mode: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The copy's logits as the choice computes them (by its tiles' `mode`, its own by default), and each row's
    widening of the bound (zero without tiles)."""
    m, n = x.shape[0], out.weight.shape[0]
    if out.tiles is None:
        return out.kernel.linear(x, out.approx, None), torch.zeros(m)
    z, err = torch.empty(m, n), torch.empty(m)
    out.kernel.lib.int8_tiles_product(x.data_ptr(), out.tiles.data_ptr(), out.tile_sums.data_ptr(),
                                  out.approx.scales.data_ptr(), m, x.shape[1], n, 2,
                                  amx_tiles.MODES[mode or out.tiles_mode], z.data_ptr(), err.data_ptr())
    return z, err * out.tiles_norm


def test_the_tiles_hold_the_copy():
    """Inputs the digits hold exactly (integers up to 127): the tiles' logits are the copy's product, for sizes that
    fill no tile evenly, and the bound widens by no more than a guard."""
    kernel = kernel_or_why()
    if kernel is None:
        return
    gen = torch.Generator().manual_seed(4)
    for n, k in [(300, 64), (37, 130), (16, 3)]:
        out = GreedyOutput(torch.randn(n, k, generator=gen), kernel, torch.int8, "stand-in")
        x = torch.randint(-127, 128, (5, k), generator=gen).float()
        x[:, 0] = 127.0
        z, widened = approximate_logits(out, x)
        copy = torch.cat([out.approx.blocks[b].T for b in range(out.approx.blocks.shape[0])])[:n].double()
        expected = x.double() @ (copy * out.approx.scales[:n, None].double()).T
        assert torch.allclose(z.double(), expected, rtol=1e-6, atol=1e-6)
        assert (widened <= 1e-8 * x.norm(dim=1) * out.tiles_norm).all()   # only the guard for the doubles' rounding


@pytest.mark.parametrize("tiles", ["stand-in", "auto"])
def test_the_digits_error_is_in_the_bound(tiles):
    """A weight its int8 copy holds exactly leaves only the digits' error (made large by an outlier in x): the bound
    holds with the widening, and not without it, so a choice that ignored it could miss the argmax."""
    kernel = kernel_or_why()
    if kernel is None:
        return
    gen = torch.Generator().manual_seed(7)
    q = torch.randint(-127, 128, (500, 128), generator=gen).float()
    q[:, 0] = 127.0
    weight = q / 128   # an int8 copy is this weight itself
    out = GreedyOutput(weight, kernel, torch.int8, tiles)
    x = torch.randn(16, 128, generator=gen)
    x[:, 7] = 3e3
    exact = kernel.linear(x, kernel.pack(weight), None).double()
    approx, widened = approximate_logits(out, x)
    gap = (exact - approx.double()).abs()
    weights_part = x.double().norm(dim=1, keepdim=True) * out.bound.double()
    assert (gap <= weights_part + widened.double()[:, None]).all()
    if out.tiles is not None:   # ("auto" where there are no AMX tiles: the FMAs, which have no digits)
        assert (gap > weights_part).any()
    assert torch.equal(out.choose(x), exact.float().max(-1).indices)


def test_amx_tiles_give_their_stand_ins_bits():
    """Integer sums are exact: the AMX product and its plain-C stand-in give the same logits. Where this machine has
    no AMX (or its OS lends none), asking for it says so in one line."""
    kernel = kernel_or_why()
    if kernel is None:
        return
    gen = torch.Generator().manual_seed(5)
    weight, x = torch.randn(1000, 200, generator=gen), torch.randn(19, 200, generator=gen) * 3
    if not kernel.lib.amx_tiles_usable():
        with pytest.raises(ValueError, match="AMX tiles are not available here"):
            GreedyOutput(weight, kernel, torch.int8, "amx")
        # auto: by VNNI where the build has it, else the FMAs
        assert GreedyOutput(weight, kernel, torch.int8).tiles_mode == ("vnni" if kernel.lib.vnni_built() else "off")
        return
    amx, stand_in = GreedyOutput(weight, kernel, torch.int8, "amx"), GreedyOutput(weight, kernel, torch.int8, "stand-in")
    assert GreedyOutput(weight, kernel, torch.int8).tiles_mode == "amx"   # auto
    for rows in (x[:1], x[:8], x):   # one row, a tile's part, and more rows than a tile holds
        a, b = approximate_logits(amx, rows), approximate_logits(stand_in, rows)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("build", ["this machine's", "avx2-vnni", "avx2-vnni-stand-in"])
def test_vnni_gives_the_stand_ins_bits(build):
    """The VNNI product (the digits plus 128, each output's sum of weights times 128 taken off) gives the stand-in's
    logits: by VPDPBUSD where this build has it, else by the same loop with the instruction written out, on every
    machine; and so does the build an AVX2 CPU with AVX-VNNI gets (256 bits, a row at a time; where this CPU has no
    AVX-VNNI, its loop with the instruction written out), and that written-out build on every machine. Rows pass six at
    a time over two blocks of outputs: row and output counts on and off those edges. Asking for it where the build has
    no VNNI says so in one line."""
    kernel = kernel_or_why() if build == "this machine's" else few_rows.kernel(build)
    if kernel is None:   # (the AVX2 build: not on a CPU of another architecture)
        assert KERNEL is None or platform.machine() not in ("x86_64", "AMD64")
        return
    gen = torch.Generator().manual_seed(6)
    for n, k in [(1000, 200), (40, 64), (17, 3)]:   # an odd block count (the last block alone), one chunk, a tiny K
        weight = torch.randn(n, k, generator=gen)
        weight[:, 0] = -weight.abs().max()   # outputs whose weights sum far from 0: the correction matters
        out = GreedyOutput(weight, kernel, torch.int8, "stand-in")
        x = torch.randn(19, k, generator=gen) * 3
        x[3] = 0.0   # a row of zeros: digits of 0, every byte 128
        for rows in (x[:1], x[:6], x[:7], x[:16], x):
            vnni, plain = approximate_logits(out, rows, "vnni"), approximate_logits(out, rows, "stand-in")
            assert torch.equal(vnni[0], plain[0]) and torch.equal(vnni[1], plain[1])
    if kernel.lib.vnni_built():
        vnni = GreedyOutput(weight, kernel, torch.int8, "vnni")
        assert torch.equal(vnni.choose(x), kernel.linear(x, kernel.pack(weight), None).max(-1).indices)
    else:
        with pytest.raises(ValueError, match="VNNI is not available here"):
            GreedyOutput(weight, kernel, torch.int8, "vnni")


def test_without_amx_auto_takes_vnni_and_avx512_bf16_where_built_else_the_fmas(monkeypatch):
    """The choice a CPU without AMX makes, on any machine: VNNI where the build has it, else the FMAs; and a bf16
    model's products by AVX512-BF16 from tiles where the build has it, else by the FMAs."""
    kernel = kernel_or_why()
    if kernel is None:
        return
    weight = torch.randn(64, 32)
    monkeypatch.setattr(amx_tiles, "usable", lambda kernel: False)
    monkeypatch.setattr(amx_tiles, "vnni_usable", lambda kernel: True)
    assert GreedyOutput(weight, kernel, torch.int8).tiles_mode == "vnni"
    monkeypatch.setattr(amx_tiles, "vnni_usable", lambda kernel: False)
    assert GreedyOutput(weight, kernel, torch.int8).tiles_mode == "off"
    target = tiny_target("llama", dtype=torch.bfloat16)
    for dots, way in [(True, "avx512-bf16"), (False, "")]:
        monkeypatch.setattr(amx_tiles, "bf16_dots_usable", lambda kernel: dots)
        target.use_lean()
        assert target.lean.native is None or target.bf16_tiles == way
    if target.lean.native is not None:
        with pytest.raises(ValueError, match="bf16 tiles 'fast': one of 'off', 'amx', 'stand-in', 'avx512-bf16'"):
            target.use_lean(tiles="fast")


def test_tiles_are_asked_for_an_int8_copy_only():
    kernel = kernel_or_why()
    if kernel is None:
        return
    weight = torch.randn(40, 16)
    with pytest.raises(ValueError, match="a bf16 copy has none"):
        GreedyOutput(weight, kernel, torch.bfloat16, "stand-in")
    with pytest.raises(ValueError, match="tiles 'fast': one of 'auto', 'off', 'amx', 'stand-in', 'vnni'"):
        GreedyOutput(weight, kernel, torch.int8, "fast")
    assert GreedyOutput(weight, kernel, torch.bfloat16).tiles is None   # auto: a bf16 copy has no tiles


def test_a_verify_gives_the_choices_its_logits_give():
    target = tiny_target("llama", seed=5)
    if target.forward_kind != "lean-native":
        return
    assert target.lean.native.greedy is not None
    cache = target.new_cache()
    target.prefill([1, 7, 9, 4, 22], cache)
    tree = TokenTree([4, 8, 9, 30, 31], [-1, 0, 0, 1, 1])
    logits, feats = target.verify(tree, cache, features=True)
    target.rollback(cache, 5)
    choices, same_feats = target.verify(tree, cache, features=True, choices=True)
    assert torch.equal(choices, logits.max(-1).indices) and torch.equal(feats, same_feats)


def test_the_copy_serves_the_rows_where_it_was_never_slower():
    record = {"rows": [1, 4, 8, 16], "full": [0.020, 0.021, 0.023, 0.029], "copy": [0.017, 0.021, 0.024, 0.028]}
    assert copy_choice(record) == CopyChoice(4)   # slower at 8: the full layer from there on, whatever 16 said
    assert copy_choice({**record, "copy": [0.021, 0.01, 0.01, 0.01]}).rows == 0
    assert copy_choice({**record, "copy": record["full"]}).rows == 16


def test_the_tiles_serve_the_rows_from_which_they_were_never_slower():
    """With AMX tiles the copy is served by its faster way, and the tiles from the rows on which they never lost."""
    record = {"rows": [1, 4, 8, 16], "full": [0.020, 0.021, 0.023, 0.029], "copy": [0.017, 0.021, 0.024, 0.028],
              "tiles": [0.018, 0.020, 0.022, 0.023]}
    assert copy_choice(record) == CopyChoice(16, 4)   # one row: the FMAs; the tiles win from 4 rows, and at 8
    assert copy_choice({**record, "tiles": [0.016, 0.022, 0.022, 0.023]}) == CopyChoice(16, 8)   # lost at 4
    assert copy_choice({**record, "tiles": [0.016, 0.020, 0.022, 0.030]}).tile_rows is None      # lost at the last
    assert copy_choice({**record, "tiles": [0.016, 0.020, 0.022, 0.023]}) == CopyChoice(16, 1)


def test_the_copys_rows_are_measured_and_applied(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    target = tiny_target("llama", seed=6)
    if target.forward_kind != "lean-native":
        assert greedy_copy_choice(target) is None   # no C layer: no copy to measure
        return
    native = target.lean.native
    record = measure_greedy_copy(target, rows=(1, 4, 8), rounds=1)
    timed = record["rows"]
    assert timed == [1, 4, 8][:len(timed)] and all(t > 0 for t in record["full"] + record["copy"])
    assert ("tiles" in record) == (native.greedy.tiles is not None)   # where there are AMX tiles, they are timed too
    # timed up to the first size at which the copy by its faster way was slower, none past it
    slower = [min(c, t) > f for f, c, t in zip(record["full"], record["copy"], record.get("tiles", record["copy"]))]
    assert not any(slower[:-1]) and (slower[-1] or len(timed) == 3)
    assert native.greedy_rows == native.max_rows and native.greedy.tile_rows == 1   # left as it found them
    choice = greedy_copy_choice(target)
    assert choice.rows in (0, 1, 4, 8, 16, 32, 64) and greedy_copy_choice(target) == choice   # read back: the file
    assert (choice.tile_rows is None) if native.greedy.tiles is None else choice.tile_rows in (None, 1, 4, 8, 16, 32, 64)
    cache = target.new_cache()
    target.prefill([1, 7, 9, 4, 22], cache)
    tree = TokenTree([4, 8, 9, 30, 31], [-1, 0, 0, 1, 1])
    expected = target.verify(tree, cache)[0].max(-1).indices
    # the full layer, the copy up to 4 rows, the copy everywhere, with its tiles from 1 or 4 rows or never: the same
    for served, tile_rows in [(0, 1), (4, 1), (None, 1), (None, 4), (None, None)]:
        target.use_greedy_copy(served, tile_rows)
        assert native.greedy_rows == (native.max_rows if served is None else served)
        assert native.greedy.tile_rows == tile_rows
        target.rollback(cache, 5)
        assert torch.equal(target.verify(tree, cache, choices=True)[0], expected)
