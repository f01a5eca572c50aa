"""Our few-row fp32 kernel (dart_core/machine/few_rows.c): built for this CPU (or for the kind this process is held to,
tests/test_cpu_kinds.py), it computes x @ W^T + b as torch does, each row alone, and a build that cannot happen says
why instead of failing. Where this machine has no C compiler, the stand-in (the same packing, torch's arithmetic) is
what the `capable` fixture runs, and these tests check that the build says so."""

import os
import platform
import shutil

import pytest
import torch
import torch.nn.functional as F

from dart_core.machine import few_rows
from dart_core.machine.cpu_info import cpu_flags
from dart_core.machine.hardware import detect

from tests.q4_blocks import q4_1_values

HERE = detect()
KERNEL = few_rows.kernel(HERE.kind)


def real_or_why():
    """The kernel built here; where none can be built, the reason must be said and the stand-in is all there is."""
    if KERNEL is None:
        assert few_rows.why_not(HERE.kind) and not HERE.few_rows
    return KERNEL


# Products of more than 8 rows go in passes of 8 rows with 32 vector registers (AVX-512), of 4 with 16 (AVX2): the
# AVX2 build passing them 8 at a time runs the other layout on every CPU with AVX2 (few_rows.MARCH)
BUILDS = ["this machine's", "avx2-passes-of-8"]


def built(build: str):
    if build == "this machine's":
        return real_or_why()
    if "avx2" not in cpu_flags():   # its instructions: not on a CPU without AVX2 (nor of another architecture)
        return None
    kernel = few_rows.kernel(build)
    assert kernel is not None or KERNEL is None, few_rows.why_not(build)
    return kernel


def test_wherever_a_c_compiler_is_found_the_kernels_build():
    """A fault in our C sources must fail here, not pass as a machine without a compiler (which falls back)."""
    if os.environ.get("DART_FEW_ROWS") == "off" or not (shutil.which(os.environ.get("CC") or "cc")
                                                         or shutil.which("gcc")):
        assert KERNEL is None
        return
    why = few_rows.why_not(HERE.kind)
    if why is not None and why.startswith(few_rows.NO_TOOLCHAIN):   # this machine's toolchain, not our sources
        return
    assert why is None and KERNEL is not None and HERE.few_rows


@pytest.mark.parametrize("out_features,in_features", [(1, 5), (7, 16), (33, 70), (100, 64), (257, 576)])
def test_it_computes_what_torch_computes_for_any_shape_rows_and_bias(out_features, in_features):
    kernel = real_or_why()
    gen = torch.Generator().manual_seed(out_features)
    linear = torch.nn.Linear(in_features, out_features)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(out_features, in_features, generator=gen))
    for bias in (None, linear.bias.detach()):
        for rows in (1, 2, 3, 8, 9, 20):
            x = torch.randn(rows, in_features, generator=gen)
            expected = F.linear(x, linear.weight, bias)
            outs = [few_rows.stand_in_linear(x, few_rows.pack(linear.weight, 16), bias)]
            if kernel is not None:
                outs.append(kernel.linear(x, kernel.pack(linear.weight), bias))
            for out in outs:
                assert out.shape == (rows, out_features)
                assert torch.allclose(out, expected, atol=1e-4, rtol=1e-4), (rows, bias is None)


@pytest.mark.parametrize("out_features,in_features", [(1, 5), (33, 70), (257, 576)])
def test_bf16_weights_give_the_fp32_product_of_the_widened_weights(out_features, in_features):
    """The draft head's products read bf16 weights: exactly the fp32 kernel on the same weights rounded to bf16."""
    kernel = real_or_why()
    gen = torch.Generator().manual_seed(in_features)
    weight, bias = torch.randn(out_features, in_features, generator=gen), torch.randn(out_features, generator=gen)
    rounded = weight.bfloat16().float()
    for rows in (1, 6, 9):
        x = torch.randn(rows, in_features, generator=gen)
        expected = F.linear(x, rounded, bias)
        stand_in = few_rows.stand_in_linear(x, few_rows.pack(weight, 16, torch.bfloat16), bias)
        assert torch.allclose(stand_in, expected, atol=1e-4, rtol=1e-4)
        if kernel is not None:
            packed = kernel.pack(weight, torch.bfloat16)
            assert packed.blocks.dtype == torch.bfloat16
            assert torch.equal(kernel.linear(x, packed, bias), kernel.linear(x, kernel.pack(rounded), bias))
            assert torch.allclose(kernel.linear(x, packed, bias), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("out_features,in_features", [(1, 5), (33, 70), (257, 576)])
def test_int8_weights_give_the_product_of_their_scaled_values(out_features, in_features):
    """The draft head's products can read int8 weights with a scale per output: the product of the dequantized
    weights, the largest weight of each output kept to within half a step."""
    kernel = real_or_why()
    gen = torch.Generator().manual_seed(in_features)
    weight, bias = torch.randn(out_features, in_features, generator=gen), torch.randn(out_features, generator=gen)
    weight[0] = 0.0                                         # an output of zeros keeps a usable scale
    packed = few_rows.pack(weight, 16, torch.int8)
    assert packed.blocks.dtype == torch.int8 and packed.scales.shape == (-(-out_features // 16) * 16,)
    values = torch.einsum("bkv,bv->bvk", packed.blocks.float(), packed.scales.view(-1, 16)).reshape(-1, in_features)
    assert torch.allclose(values[:out_features], weight, atol=float(weight.abs().max()) / 254 + 1e-6)
    for rows in (1, 6, 9):
        x = torch.randn(rows, in_features, generator=gen)
        expected = F.linear(x, values[:out_features], bias)
        assert torch.allclose(few_rows.stand_in_linear(x, packed, bias), expected, atol=1e-4, rtol=1e-4)
        if kernel is not None:
            ours = kernel.pack(weight, torch.int8)
            assert torch.allclose(kernel.linear(x, ours, bias), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("build", BUILDS)
def test_a_row_gets_the_same_bits_alone_as_among_others_and_on_any_thread_count(build):
    """Each output is summed in one fixed order whatever the rows beside it: a tree's verify reproduces plain
    decoding's products bit for bit."""
    kernel = built(build)
    if kernel is None:
        return
    gen = torch.Generator().manual_seed(0)
    weight, b = torch.randn(200, 150, generator=gen), torch.randn(200, generator=gen)
    x = torch.randn(21, 150, generator=gen)    # several passes of rows, over spans of inputs (the last a short one)
    for dtype in few_rows.WEIGHT_KINDS:
        w = kernel.pack(weight, dtype)
        together = kernel.linear(x, w, b)
        assert all(torch.equal(kernel.linear(x[i: i + 1], w, b)[0], together[i]) for i in range(21)), dtype
        assert torch.equal(kernel.linear(x[3:9], w, b), together[3:9])
        assert torch.equal(kernel.linear(x[2:15], w, b), together[2:15])
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            assert torch.equal(kernel.linear(x, w, b), together)
        finally:
            torch.set_num_threads(threads)


@pytest.mark.parametrize("way, build", [("amx", "this machine's"), ("stand-in", "this machine's"),
                                        ("avx512-bf16", "this machine's"), ("avx512-bf16", "avx2")])
def test_bf16_tiles_give_bf16_inputs_product_each_row_alone(way, build):
    """A bf16 model's product from tiles (bf16_tiles.c), each way: on AMX (its plain-C stand-in where AMX is not
    usable), by the stand-in, by AVX512-BF16 (where this build has it; else, and in the AVX2 build on every machine,
    its arithmetic written out): each row of x rounded to bf16, times the weight, summed in fp32, plus the bias: within
    fp32's rounding of the exact sum, for shapes that fill no tile evenly and row counts on and off a pass's edges, and
    every row alone the same bits as among others."""
    kernel = real_or_why() if build == "this machine's" else few_rows.kernel(build)
    if kernel is None:   # (the AVX2 build: not on a CPU of another architecture)
        assert KERNEL is None or platform.machine() not in ("x86_64", "AMD64")
        return
    from dart_core.machine import amx_tiles
    gen = torch.Generator().manual_seed(9)
    for n, k in [(300, 64), (37, 130), (16, 3), (257, 576), (49, 96)]:
        weight = torch.randn(n, k, generator=gen).bfloat16()
        tiles, bias = amx_tiles.bf16_tiles(weight), torch.randn(n, generator=gen)
        x = torch.randn(19, k, generator=gen) * 3

        def product(rows: torch.Tensor) -> torch.Tensor:
            y = torch.empty(rows.shape[0], n)
            kernel.lib.bf16_tiles_linear(rows.data_ptr(), tiles.data_ptr(), bias.data_ptr(), y.data_ptr(),
                                         rows.shape[0], k, n, 2, few_rows.BF16_WAYS[way])
            return y
        y = product(x)
        terms = x.bfloat16().double()[:, None, :] * weight.double()[None]          # [rows, n, k], each exact
        exact = terms.sum(-1) + bias.double()
        bound = (k + 2) * 2.0 ** -24 * (terms.abs().sum(-1) + bias.double().abs())  # any order of fp32 additions
        assert ((y.double() - exact).abs() <= bound).all()
        for i in (0, 5, 8, 18):
            assert torch.equal(product(x[i:i + 1].contiguous())[0], y[i])
        assert torch.equal(product(x[3:12].contiguous()), y[3:12])


def test_avx512_bf16_gives_the_bits_of_its_written_out_arithmetic():
    """VDPBF16PS, where this build has it, gives the bits of the arithmetic Intel's manual gives for it, as the AVX2
    build writes it out (and every build without AVX512-BF16): the written-out loop the suite runs on every machine
    is the instruction's stand-in, to the bit."""
    kernel, written_out = real_or_why(), few_rows.kernel("avx2")
    if kernel is None or written_out is None:
        assert KERNEL is None or platform.machine() not in ("x86_64", "AMD64")
        return
    from dart_core.machine import amx_tiles
    assert not amx_tiles.bf16_dots_usable(written_out)
    gen = torch.Generator().manual_seed(11)
    for n, k, rows in [(300, 576, 1), (300, 576, 9), (49, 1536, 16), (33, 70, 21)]:
        weight = torch.randn(n, k, generator=gen).bfloat16()
        weight[0, :7] = torch.tensor([1e-39, -1e-39, 3e38, 1e-20, 1.0, 0.0, -0.0])   # subnormal, large, tiny
        dots = amx_tiles.packed_bf16_tiles(weight, "avx512-bf16")
        x = torch.randn(rows, k, generator=gen) * 5
        x[0, :3] = torch.tensor([1e-39, 1e-19, 2.0])
        bias = torch.randn(n, generator=gen)
        assert torch.equal(kernel.linear(x, dots, bias), written_out.linear(x, dots, bias))


@pytest.mark.parametrize("columns", [1, 15, 16, 17, 100, 49152])
def test_the_argmax_picks_what_torchs_max_picks(columns):
    """Greedy decoding's choice from a verify's logits: the first of equal maxima, a NaN above every number, an all
    -inf row's first entry, on one thread or several (each scanning its own columns)."""
    kernel = real_or_why()
    if kernel is None:
        return
    gen = torch.Generator().manual_seed(columns)
    rows = [torch.randn(columns, generator=gen), torch.randint(0, 3, (columns,), generator=gen).float(),
            torch.full((columns,), float("-inf")), torch.zeros(columns)]
    with_nans = torch.randn(columns, generator=gen)
    with_nans[columns // 2] = with_nans[-1] = float("nan")
    late_max = torch.randn(columns, generator=gen)
    late_max[-1] = 100.0   # in the last thread's share
    y = torch.stack(rows + [with_nans, late_max])
    threads = torch.get_num_threads()
    try:
        for n in {1, 2, threads}:
            torch.set_num_threads(n)
            assert torch.equal(kernel.argmax(y), y.max(-1).indices), n
            assert torch.equal(kernel.argmax(y[4:5]), y[4:5].max(-1).indices)
    finally:
        torch.set_num_threads(threads)


def test_bad_inputs_are_refused_in_one_line():
    kernel = real_or_why()
    if kernel is None:
        return
    w = kernel.pack(torch.randn(8, 16))
    with pytest.raises(ValueError, match="few-row kernel"):
        kernel.linear(torch.randn(2, 15), w, None)
    with pytest.raises(ValueError, match="few-row kernel"):
        kernel.linear(torch.randn(2, 16, dtype=torch.float64), w, None)
    other = few_rows.pack(torch.randn(8, 16), 2 * kernel.width)   # not the groups this build reads
    with pytest.raises(ValueError, match=f"packed {2 * kernel.width} outputs wide"):
        kernel.linear(torch.randn(2, 16), other, None)


def test_a_build_that_cannot_happen_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("DART_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "false")      # a "compiler" that fails every build
    monkeypatch.setattr(few_rows.shutil, "which", lambda name: "/bin/false" if name == "false" else None)
    said = few_rows._built.__wrapped__(HERE.kind)
    assert isinstance(said, str) and said.startswith(few_rows.NO_TOOLCHAIN)   # it fails a plain program too
    monkeypatch.setattr(few_rows.shutil, "which", lambda name: None)
    assert few_rows._built.__wrapped__(HERE.kind) == "no C compiler (cc) on this machine"
    monkeypatch.setattr(few_rows.shutil, "which", lambda name: "/usr/bin/cc")
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("DART_CACHE_DIR", str(blocked / "below a file"))   # a cache folder that cannot be made
    assert few_rows._built.__wrapped__(HERE.kind).startswith(few_rows.UNWRITABLE)
    monkeypatch.setenv("DART_FEW_ROWS", "off")
    assert "DART_FEW_ROWS=off" in few_rows._built.__wrapped__(HERE.kind)
    assert not list(tmp_path.rglob("*.so"))      # nothing half-written was left


def test_a_fault_in_our_sources_is_told_from_a_missing_toolchain(tmp_path, monkeypatch):
    if KERNEL is None:   # no working compiler here: nothing to tell apart
        return
    broken = tmp_path / "broken.c"
    broken.write_text("void few_rows_linear(void) { undefined_call(); }\n")
    monkeypatch.setenv("DART_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(few_rows, "SOURCES", (broken,))
    said = few_rows._built.__wrapped__(HERE.kind)
    assert said.startswith("the C compiler failed on our sources") and "undefined_call" in said
    assert not list((tmp_path / "cache").rglob("*.so"))


def test_the_kernel_shares_torchs_openmp_runtime():
    """Two OpenMP runtimes would each keep threads spinning on the same two cores."""
    kernel = real_or_why()
    if kernel is None or platform.system() != "Linux":
        return
    kernel.linear(torch.randn(2, 16), kernel.pack(torch.randn(8, 16)), None)
    with open("/proc/self/maps") as fh:
        runtimes = {line.split()[-1] for line in fh if "libgomp" in line or "libiomp" in line}
    assert len(runtimes) <= 1, runtimes


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("out_features,in_features", [(1, 32), (47, 64), (100, 96), (257, 576)])
def test_q4_1_blocks_give_the_bits_of_the_fp32_product(out_features, in_features, build):
    """fp32 weights that are Q4_1 blocks (the default model's decoder), packed and read as those blocks: every output
    the same bits as the fp32 product's, for any rows (one pass, several passes over spans) and with a bias."""
    kernel = built(build)
    if kernel is None:
        return
    gen = torch.Generator().manual_seed(out_features)
    weight = q4_1_values(torch.randn(out_features, in_features, generator=gen) * 0.05)
    bias = torch.randn(out_features, generator=gen)
    fp32, blocks = kernel.pack(weight), kernel.pack_q4_1(weight)
    assert blocks is not None and blocks.kind == few_rows.Q4_1_KIND
    assert blocks.blocks.nbytes < fp32.blocks.nbytes / 4
    for rows in (1, 2, 3, 8, 9, 17, 64):
        x = torch.randn(rows, in_features, generator=gen)
        for b in (None, bias):
            assert torch.equal(kernel.linear(x, blocks, b), kernel.linear(x, fp32, b)), (rows, b is None)


def test_weights_that_are_not_q4_1_blocks_are_read_in_fp32():
    kernel = real_or_why()
    if kernel is None:
        return
    gen = torch.Generator().manual_seed(1)
    weight = q4_1_values(torch.randn(64, 96, generator=gen))
    assert kernel.pack_q4_1(weight) is not None
    moved = weight.clone()
    moved[40, 70] = torch.nextafter(moved[40, 70], torch.tensor(9.0))   # one value a unit off its block's grid
    assert kernel.pack_q4_1(moved) is None
    assert kernel.pack_q4_1(torch.randn(64, 96, generator=gen)) is None            # a model trained in fp32
    assert kernel.pack_q4_1(q4_1_values(torch.randn(8, 64, generator=gen))[:, :48].contiguous()) is None   # K % 32
    assert kernel.pack_q4_1(weight.to(torch.bfloat16)) is None
