"""linear_logprobs against the direct computation: full logits, log_softmax, gather, softmax entropy."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from trainer import logprobs as logprobs_module
from trainer.logprobs import linear_logprobs


def _generator(seed):
    return torch.Generator().manual_seed(seed)


def _inputs(seed, rows, hidden_size, vocab, dtype=torch.float64, scale=1.0):
    g = _generator(seed)
    hidden = torch.randn(rows, hidden_size, generator=g, dtype=dtype)
    weight = scale * torch.randn(vocab, hidden_size, generator=g, dtype=dtype) / hidden_size**0.5
    bias = torch.randn(vocab, generator=g, dtype=dtype)
    targets = torch.randint(0, vocab, (rows,), generator=g)
    return hidden, weight, bias, targets


def _direct(hidden, weight, targets, temperature=1.0, bias=None):
    """The (N, V) path this module avoids, written the textbook way."""
    logits = hidden @ weight.T
    if bias is not None:
        logits = logits + bias
    log_probs = torch.log_softmax(logits / temperature, dim=-1)  # (N, V)
    picked = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(torch.softmax(logits / temperature, dim=-1) * log_probs).sum(-1)
    return picked, entropy


# --- values -------------------------------------------------------------------


@pytest.mark.parametrize("chunk_tokens", [1, 4, 7, 64])  # 7 leaves an uneven last chunk of 23 rows
@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("with_bias", [False, True])
def test_values_match_direct_computation(chunk_tokens, temperature, with_bias):
    hidden, weight, bias, targets = _inputs(0, 23, 8, 31, scale=4.0)
    bias = bias if with_bias else None
    logprobs, entropy = linear_logprobs(
        hidden, weight, targets, temperature=temperature, with_entropy=True, chunk_tokens=chunk_tokens, bias=bias
    )
    expected_logprobs, expected_entropy = _direct(hidden, weight, targets, temperature, bias)
    assert logprobs.dtype == entropy.dtype == torch.float64
    torch.testing.assert_close(logprobs, expected_logprobs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(entropy, expected_entropy, rtol=1e-12, atol=1e-12)


def test_without_entropy_returns_none_and_the_same_logprobs():
    hidden, weight, _, targets = _inputs(1, 10, 4, 9)
    logprobs, entropy = linear_logprobs(hidden, weight, targets, chunk_tokens=3)
    assert entropy is None
    torch.testing.assert_close(logprobs, linear_logprobs(hidden, weight, targets, with_entropy=True)[0])


def test_float32_and_bfloat16_inputs_give_float32_outputs():
    hidden, weight, _, targets = _inputs(2, 5, 4, 9, dtype=torch.float32)
    for dtype in (torch.float32, torch.bfloat16):
        logprobs, entropy = linear_logprobs(hidden.to(dtype), weight.to(dtype), targets, with_entropy=True)
        assert logprobs.dtype == entropy.dtype == torch.float32


def test_bfloat16_is_close_to_float64_reference():
    """Tolerance: a bf16 logit carries a relative rounding error of at most 2^-9, so
    |d logprob| <= |d z_target| + max_j |d z_j| <= 2^-8 max|z|, and, as
    dH = -sum_j p_j (log p_j + H) dz_j, |d H| <= 2 H max|dz| <= H 2^-8 max|z|;
    1e-5 more covers the fp32 arithmetic. The reference takes the same
    bf16-rounded inputs in fp64, so only the bf16 matmul output differs."""
    hidden, weight, _, targets = _inputs(3, 200, 64, 1000, dtype=torch.float32, scale=3.0)
    hidden, weight = hidden.bfloat16(), weight.bfloat16()
    logprobs, entropy = linear_logprobs(hidden, weight, targets, with_entropy=True, chunk_tokens=64)
    expected_logprobs, expected_entropy = _direct(hidden.double(), weight.double(), targets)
    largest_logit = (hidden.double() @ weight.double().T).abs().amax(dim=-1)  # (N,)
    assert largest_logit.max() > 5  # logits of a realistic spread, so the bound is not trivially met
    assert ((logprobs.double() - expected_logprobs).abs() <= 2**-8 * largest_logit + 1e-5).all()
    assert ((entropy.double() - expected_entropy).abs() <= expected_entropy * 2**-8 * largest_logit + 1e-5).all()


# --- gradients ----------------------------------------------------------------

# Which outputs the loss uses; the others get no gradient (None in backward).
USES = {
    "logprobs_only_output": (False, lambda lp, ent: lp),
    "logprobs_entropy_unused": (True, lambda lp, ent: lp),
    "entropy_only": (True, lambda lp, ent: ent),
    "both": (True, lambda lp, ent: lp * 0.7 - ent * 1.3),
}


@pytest.mark.parametrize("use", USES)
def test_gradcheck(use):
    with_entropy, combine = USES[use]
    hidden, weight, bias, targets = _inputs(4, 7, 4, 9, scale=3.0)
    leaves = [x.requires_grad_() for x in (hidden, weight, bias)]

    def outputs(hidden, weight, bias):
        logprobs, entropy = linear_logprobs(
            hidden, weight, targets, temperature=0.7, with_entropy=with_entropy, chunk_tokens=3, bias=bias
        )
        return combine(logprobs, entropy)

    assert torch.autograd.gradcheck(outputs, leaves)


@pytest.fixture
def eager_fused(monkeypatch):
    """fused=True with its chunk expressions run eagerly: the same code torch.compile gets on CUDA."""
    monkeypatch.setitem(logprobs_module._compiled, "stats", logprobs_module._fused_stats)
    monkeypatch.setitem(logprobs_module._compiled, "dlogits", logprobs_module._fused_dlogits)


@pytest.mark.slow
def test_fused_kernels_compile_once_for_every_chunk_size(monkeypatch):
    """The compiled chunk kernels take the rows as a runtime size from their first call: the
    shorter last chunk of a micro-batch, and the next micro-batch's, compile nothing more."""
    monkeypatch.setattr(logprobs_module, "_compiled", {})  # this test's own compiled kernels
    torch._dynamo.reset()
    graphs = torch._dynamo.utils.counters["stats"]
    before = graphs["unique_graphs"]
    try:
        for rows in (200, 150, 97):  # chunks of 64: 64, 64, 64, 8; 64, 64, 22; 64, 33
            hidden, weight, bias, targets = _inputs(rows, rows, 16, 40, dtype=torch.float32)
            leaves = [t.requires_grad_() for t in (hidden, weight)]
            compiled = linear_logprobs(hidden, weight, targets, with_entropy=True, chunk_tokens=64, fused=True)
            direct = _direct(hidden, weight, targets)
            for ours, theirs in zip(compiled, direct):
                torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
            grads = torch.autograd.grad(compiled[0].sum() - compiled[1].sum(), leaves)
            expected = torch.autograd.grad(direct[0].sum() - direct[1].sum(), leaves)
            for ours, theirs in zip(grads, expected):
                torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
        assert graphs["unique_graphs"] - before == 2  # the statistics and the d logits kernel, once each
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("use", USES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_fused_chunks_equal_the_in_place_passes(eager_fused, use, with_bias):
    with_entropy, combine = USES[use]
    hidden, weight, bias, targets = _inputs(8, 23, 8, 31, scale=3.0)
    bias = bias if with_bias else None
    results = []
    for fused in (False, True):
        leaves = [x.clone().requires_grad_() for x in (hidden, weight) + ((bias,) if with_bias else ())]
        logprobs, entropy = linear_logprobs(leaves[0], leaves[1], targets, temperature=0.7, with_entropy=with_entropy,
                                            chunk_tokens=7, bias=leaves[2] if with_bias else None, fused=fused)
        combine(logprobs, entropy).sum().backward()
        results.append([logprobs, entropy] + [leaf.grad for leaf in leaves])
    for plain, fused in zip(*results):
        if plain is not None:
            torch.testing.assert_close(fused, plain, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("use", USES)
def test_fused_gradcheck(eager_fused, use):
    with_entropy, combine = USES[use]
    hidden, weight, bias, targets = _inputs(9, 7, 4, 9, scale=3.0)
    leaves = [x.requires_grad_() for x in (hidden, weight, bias)]

    def outputs(hidden, weight, bias):
        logprobs, entropy = linear_logprobs(hidden, weight, targets, temperature=0.7, with_entropy=with_entropy,
                                            chunk_tokens=3, bias=bias, fused=True)
        return combine(logprobs, entropy)

    assert torch.autograd.gradcheck(outputs, leaves)


def _loss_with_tied_weight(params, forward, ids, advantages, mask):
    """A tiny tied-embedding LM: weight embeds the ids and is the lm_head, so its grad has two sources."""
    embedded = params["weight"][ids]  # (N, H)
    hidden = torch.tanh(embedded @ params["mix"])  # (N, H)
    logprobs, entropy = forward(hidden, params["weight"], params["bias"])
    return -(advantages * logprobs * mask).sum() / mask.sum() - 0.01 * (entropy * mask).sum() / mask.sum()


def test_float32_gradients_match_float64_direct_with_tied_weight():
    g = _generator(5)
    rows, hidden_size, vocab, temperature = 300, 32, 500, 0.8
    params64 = {
        "weight": torch.randn(vocab, hidden_size, generator=g, dtype=torch.float64),
        "mix": torch.randn(hidden_size, hidden_size, generator=g, dtype=torch.float64) / hidden_size**0.5,
        "bias": torch.randn(vocab, generator=g, dtype=torch.float64),
    }
    ids = torch.randint(0, vocab, (rows,), generator=g)
    targets = torch.randint(0, vocab, (rows,), generator=g)
    advantages = torch.randn(rows, generator=g, dtype=torch.float64)
    mask = (torch.rand(rows, generator=g) > 0.2).double()
    params32 = {k: v.float().requires_grad_() for k, v in params64.items()}
    for v in params64.values():
        v.requires_grad_()

    def fused(hidden, weight, bias):  # 300 rows in chunks of 64: four full chunks and one of 44
        return linear_logprobs(
            hidden, weight, targets, temperature=temperature, with_entropy=True, chunk_tokens=64, bias=bias
        )

    def direct(hidden, weight, bias):
        return _direct(hidden, weight, targets, temperature, bias)

    fused_loss = _loss_with_tied_weight(params32, fused, ids, advantages.float(), mask.float())
    direct_loss = _loss_with_tied_weight(params64, direct, ids, advantages, mask)
    fused_loss.backward()
    direct_loss.backward()
    torch.testing.assert_close(fused_loss.double(), direct_loss, rtol=1e-5, atol=1e-6)
    for name, param in params32.items():
        assert param.grad.dtype == torch.float32
        torch.testing.assert_close(param.grad.double(), params64[name].grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("chunk_tokens", [40, 96])  # several chunks summed in fp32; one chunk, nothing summed
def test_bfloat16_gradients_are_close_and_come_back_in_bfloat16(chunk_tokens):
    hidden, weight, _, targets = _inputs(6, 96, 32, 400, dtype=torch.float32, scale=3.0)
    g = _generator(7)
    grad_lp, grad_ent = torch.randn(96, generator=g), torch.randn(96, generator=g)
    grads = {}
    for dtype in (torch.bfloat16, torch.float64):
        h = hidden.bfloat16().to(dtype).requires_grad_()
        w = weight.bfloat16().to(dtype).requires_grad_()
        lp, ent = linear_logprobs(h, w, targets, with_entropy=True, chunk_tokens=chunk_tokens)
        torch.autograd.backward([lp, ent], [grad_lp.to(lp.dtype), grad_ent.to(ent.dtype)])
        grads[dtype] = (h.grad, w.grad)
    for low, exact in zip(grads[torch.bfloat16], grads[torch.float64]):
        assert low.dtype == torch.bfloat16
        # bf16 matmuls and a bf16 d logits: a few 2^-8 relative errors, summed in norm.
        assert (low.double() - exact).norm() <= 2**-6 * exact.norm()


@pytest.mark.parametrize("chunk_tokens", [40, 96])
def test_matmul_dtype_computes_as_on_cast_inputs_and_returns_gradients_in_the_inputs_dtype(chunk_tokens):
    """fp32 masters under autocast: the matmuls run in bf16 (as on bf16 copies of the inputs),
    the gradients land in fp32 for the fp32 weight and hidden."""
    hidden, weight, _, targets = _inputs(9, 96, 32, 400, dtype=torch.float32, scale=3.0)
    g = _generator(10)
    grad_lp, grad_ent = torch.randn(96, generator=g), torch.randn(96, generator=g)
    results = {}
    for name in ("matmul_dtype", "cast"):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        if name == "cast":
            lp, ent = linear_logprobs(h.bfloat16(), w.bfloat16(), targets, with_entropy=True, chunk_tokens=chunk_tokens)
        else:
            lp, ent = linear_logprobs(h, w, targets, with_entropy=True, chunk_tokens=chunk_tokens,
                                      matmul_dtype=torch.bfloat16)
        torch.autograd.backward([lp, ent], [grad_lp, grad_ent])
        results[name] = (lp, ent, h.grad, w.grad)
    (lp, ent, h_grad, w_grad), (cast_lp, cast_ent, cast_h_grad, cast_w_grad) = results["matmul_dtype"], results["cast"]
    assert torch.equal(lp, cast_lp) and torch.equal(ent, cast_ent)
    assert h_grad.dtype == w_grad.dtype == torch.float32
    torch.testing.assert_close(h_grad, cast_h_grad, rtol=0, atol=0)
    # the cast path rounds the summed weight gradient to bf16 on its way back; this one keeps fp32
    torch.testing.assert_close(w_grad, cast_w_grad, rtol=2**-7, atol=1e-6)


def test_frozen_weight_or_hidden_gets_no_gradient():
    hidden, weight, _, targets = _inputs(8, 6, 4, 9)
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    linear_logprobs(h, w, targets, chunk_tokens=4)[0].sum().backward()
    expected = h.grad, w.grad

    h = hidden.clone().requires_grad_()
    linear_logprobs(h, weight, targets, chunk_tokens=4)[0].sum().backward()
    torch.testing.assert_close(h.grad, expected[0])

    w = weight.clone().requires_grad_()
    linear_logprobs(hidden, w, targets, chunk_tokens=4)[0].sum().backward()
    torch.testing.assert_close(w.grad, expected[1])


def test_no_grad_call_records_no_graph():
    hidden, weight, _, targets = _inputs(9, 6, 4, 9)
    weight.requires_grad_()
    with torch.no_grad():
        logprobs, entropy = linear_logprobs(hidden, weight, targets, with_entropy=True)
    assert not logprobs.requires_grad and not entropy.requires_grad
    torch.testing.assert_close(logprobs, _direct(hidden, weight, targets)[0].detach())


def test_masked_rows_contribute_exactly_zero_gradient():
    hidden, weight, _, targets = _inputs(10, 12, 4, 9)
    hidden.requires_grad_()
    mask = torch.tensor([1.0, 0.0] * 6, dtype=torch.float64)
    logprobs, entropy = linear_logprobs(hidden, weight, targets, with_entropy=True, chunk_tokens=5)
    ((logprobs + entropy) * mask).sum().backward()
    assert torch.equal(hidden.grad[mask == 0], torch.zeros(6, 4, dtype=torch.float64))
    assert (hidden.grad[mask == 1] != 0).all()


def test_empty_input_gives_empty_outputs_and_zero_gradients():
    weight = torch.randn(9, 4, requires_grad=True)
    hidden = torch.zeros(0, 4, requires_grad=True)
    logprobs, entropy = linear_logprobs(hidden, weight, torch.zeros(0, dtype=torch.long), with_entropy=True)
    assert logprobs.shape == entropy.shape == (0,)
    (logprobs.sum() + entropy.sum()).backward()
    assert hidden.grad.shape == (0, 4)
    assert torch.equal(weight.grad, torch.zeros(9, 4))


# --- memory -------------------------------------------------------------------


class _LargestTensor(TorchDispatchMode):
    """Records the largest number of elements any aten op returns, backward included."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in torch.utils._pytree.tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self.largest = max(self.largest, tensor.numel())
        return out


@pytest.mark.parametrize("with_entropy", [False, True])
def test_no_full_vocabulary_tensor_for_all_rows(with_entropy):
    rows, hidden_size, vocab, chunk_tokens = 256, 8, 300, 32  # V x H and N x H are far below C x V
    hidden, weight, bias, targets = _inputs(11, rows, hidden_size, vocab, dtype=torch.float32)
    leaves = [x.requires_grad_() for x in (hidden, weight, bias)]

    def step(forward):
        with _LargestTensor() as observed:
            logprobs, entropy = forward(hidden, weight, targets, bias=bias)
            loss = logprobs.sum() + (entropy.sum() if with_entropy else 0)
            torch.autograd.grad(loss, leaves)
        return observed.largest

    # The observer sees the direct path's (N, V) logits, so it would see ours.
    assert step(lambda h, w, t, bias: _direct(h, w, t, bias=bias)) >= rows * vocab
    fused = step(lambda h, w, t, bias: linear_logprobs(
        h, w, t, with_entropy=with_entropy, chunk_tokens=chunk_tokens, bias=bias))
    assert fused == chunk_tokens * vocab


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_compiled_fused_chunks_match_the_in_place_passes():
    rows, hidden_size, vocab = 1000, 64, 5000  # chunks of 256: three full and one of 232
    g = torch.Generator(device="cuda").manual_seed(13)
    hidden = torch.randn(rows, hidden_size, device="cuda", generator=g).bfloat16()
    weight = (torch.randn(vocab, hidden_size, device="cuda", generator=g) / 4).bfloat16()
    targets = torch.randint(0, vocab, (rows,), device="cuda", generator=g)
    grad_lp, grad_ent = torch.randn(rows, device="cuda", generator=g), torch.randn(rows, device="cuda", generator=g)
    results = []
    for fused in (False, True):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        lp, ent = linear_logprobs(h, w, targets, temperature=0.8, with_entropy=True, chunk_tokens=256, fused=fused)
        torch.autograd.backward([lp, ent], [grad_lp, grad_ent])
        results.append((lp, ent, h.grad.float(), w.grad.float()))
    for plain, fused in zip(*results):
        assert (fused - plain).norm() <= 2**-7 * plain.norm()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_weight_gradient_sums_bfloat16_chunk_products_in_float32():
    from trainer.logprobs import _add_product

    g = torch.Generator(device="cuda").manual_seed(14)
    a = torch.randn(512, 300, device="cuda", generator=g).bfloat16()
    b = torch.randn(300, 96, device="cuda", generator=g).bfloat16()
    total = torch.randn(512, 96, device="cuda", generator=g)
    product = a.double() @ b.double()
    expected = total.double() + product
    _add_product(total, a, b)
    assert total.dtype == torch.float32
    # The product accumulates in fp32 and is added unrounded; rounded to bf16 first, its
    # entries would be off by up to 2**-9 of their size.
    assert (total.double() - expected).abs().max() <= 2**-14 * product.abs().max()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_bfloat16_peak_memory_stays_per_chunk():
    rows, hidden_size, vocab, chunk_tokens = 4096, 256, 32768, 256
    g = torch.Generator(device="cuda").manual_seed(12)
    hidden = torch.randn(rows, hidden_size, device="cuda", generator=g).bfloat16().requires_grad_()
    weight = (torch.randn(vocab, hidden_size, device="cuda", generator=g) / 4).bfloat16().requires_grad_()
    targets = torch.randint(0, vocab, (rows,), device="cuda", generator=g)

    def step():
        logprobs, entropy = linear_logprobs(hidden, weight, targets, with_entropy=True, chunk_tokens=chunk_tokens)
        (logprobs.sum() - entropy.sum()).backward()
        hidden.grad = weight.grad = None
        return logprobs.detach(), entropy.detach()

    step()  # cuBLAS workspaces and the like are allocated once, outside what is measured
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    logprobs, entropy = step()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    # Per chunk two fp32 (C, V) buffers (8 bytes a logit) and a bf16 one alongside one of them
    # (2 more); then the fp32 weight-gradient sum, its bf16 per-chunk term and the bf16 result
    # (8 V H), the hidden gradient and slack (4 N H).
    bound = 10 * chunk_tokens * vocab + 8 * vocab * hidden_size + 4 * rows * hidden_size
    assert extra <= bound < rows * vocab * 2, (extra, bound)  # below the direct path's bf16 logits alone
    expected_logprobs, expected_entropy = _direct(hidden.double(), weight.double(), targets)
    largest_logit = (hidden.double() @ weight.double().T).abs().amax(dim=-1)
    assert ((logprobs.double() - expected_logprobs).abs() <= 2**-8 * largest_logit + 1e-5).all()
    assert ((entropy.double() - expected_entropy).abs() <= expected_entropy * 2**-8 * largest_logit + 1e-5).all()


# --- arguments ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden": torch.zeros(3, 5)}, "need hidden"),
        ({"targets": torch.zeros(4, dtype=torch.long)}, "targets shape"),
        ({"bias": torch.zeros(8)}, "bias shape"),
        ({"temperature": 0.0}, "temperature"),
        ({"chunk_tokens": 0}, "chunk_tokens"),
    ],
)
def test_rejects_bad_arguments(change, message):
    arguments = {"hidden": torch.zeros(3, 4), "weight": torch.zeros(9, 4), "targets": torch.zeros(3, dtype=torch.long)}
    arguments |= change
    options = {k: arguments.pop(k) for k in ("bias", "temperature", "chunk_tokens") if k in arguments}
    with pytest.raises(ValueError, match=message):
        linear_logprobs(arguments["hidden"], arguments["weight"], arguments["targets"], **options)


def test_the_training_forward_passes_autocast_dtype_to_the_head():
    from trainer.forward import autocast_dtype

    x = torch.zeros(2)
    assert autocast_dtype(x) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert autocast_dtype(x) == torch.bfloat16
