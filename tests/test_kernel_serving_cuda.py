"""flash-triton's serving entry points compiled on a real GPU, against the fp64 oracle (`make test-gpu` runs these).

Same rule as the CPU tests (kernel error over all sequences <= 2 x eager attention's in the same dtype), here with
bf16, long contexts (many splits), the TMA load path of the varlen prefill, CUDA-graph capture and replay of a
decode step with changing lengths, no host synchronisation inside a call, and transformers' continuous batching
taking its decode fast path (`flash_attn_with_kvcache` over the paged cache) on our kernel.
"""

from __future__ import annotations

import functools

import pytest
import torch

from attnprof.variants import kernel_hub
from kernel_ref import Check, lse_reference, packed, within_rule
from tiny_models import counting, greedy_mismatches, tiny_llama

pytestmark = pytest.mark.cuda
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@pytest.fixture(scope="module")
def mod():
    module = kernel_hub.load()
    assert hasattr(module, "flash_attn_with_kvcache"), module
    return module


VARLEN = [  # (query lengths, key lengths, Hq, Hkv, D, dtype, causal, strided)
    ([512, 0, 1, 1000, 4096, 77], [512, 0, 1, 1000, 4096, 77], 32, 8, 128, "bf16", True, False),
    ([300, 1, 2000], [1300, 1, 2000], 8, 2, 64, "fp16", True, True),
    ([33, 700, 5], [700, 33, 0], 4, 4, 128, "bf16", False, False),
    ([300, 0, 1, 2000, 130], [1300, 5, 1, 2000, 100], 8, 2, 128, "bf16", True, False),  # 30 rows see no key
    ([300, 1, 2000], [1300, 1, 2000], 8, 2, 96, "bf16", True, True),  # 96 on the Gluon program: strided views only
]
GLUON = dict(block_m=128, block_n=128, num_warps=4, num_stages=3, gluon=True, warp_specialize=True)


@pytest.mark.parametrize("program", ["default", "gluon", "triton"])
@pytest.mark.parametrize("case", VARLEN, ids=lambda c: f"{len(c[0])}seq-d{c[4]}-{c[5]}-{'causal' if c[6] else 'full'}"
                         + ("-strided" if c[7] else ""))
def test_varlen_matches_oracle(mod, case, program):
    lq, lk, hq, hkv, d, dtype, causal, strided = case
    gen = torch.Generator().manual_seed(sum(lq))
    q, cu_q = packed(lq, hq, d, DTYPES[dtype], "cuda", gen)
    k, cu_k = packed(lk, hkv, d, DTYPES[dtype], "cuda", gen)
    v = torch.randn(k.shape, generator=gen).to(k)
    if strided:  # [total, H, D] views of [H, total, D] storage, as transformers passes them
        q, k, v = (t.transpose(0, 1).contiguous().transpose(0, 1) for t in (q, k, v))
    cfg = {"gluon": mod.Config(**GLUON), "triton": mod.default_config(d, q.device), "default": None}[program]
    if cfg is not None and cfg.gluon and (why := mod.gluon_varlen_unsupported(q, k, v, cfg)):
        with pytest.raises(ValueError, match="Gluon program"):  # refused with the reason, never run wrong
            mod.varlen_attention(q, k, v, cu_q, cu_k, max(lq), None, causal, config=cfg)
        assert torch.cuda.get_device_capability() != (9, 0), why  # strided views too: [H, total, D] storage
        return
    out = mod.varlen_attention(q, k, v, cu_q, cu_k, max(lq), None, causal, config=cfg)
    check = Check()
    for i in range(len(lq)):
        rows, keys = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        check.add(out[rows], q[rows], k[keys], v[keys], causal, d ** -0.5)
    within_rule(check.result())


def test_varlen_is_the_dense_triton_program_bit_for_bit(mod):
    q, k, v = (torch.randn(4, 1024, h, 128, device="cuda", dtype=torch.bfloat16) for h in (16, 4, 4))
    cfg = mod.default_config(128, q.device)
    dense = mod.attention(q, k, v, None, True, config=cfg)
    cu = torch.arange(0, 4097, 1024, device="cuda", dtype=torch.int32)
    varlen = mod.varlen_attention(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu, 1024, None, True,
                                  config=cfg)
    assert torch.equal(varlen.view_as(dense), dense)


KVCACHE = [  # (lengths, capacity, Hq, Hkv, D, dtype, page size (0: dense), Sq, append, config)
    ([8000, 1, 0, 4095], 8192, 32, 8, 128, "bf16", 0, 1, True, {}),
    ([8000, 1, 0, 4095], 8192, 32, 8, 128, "bf16", 64, 1, True, {}),
    ([8000, 1, 0, 4095], 8192, 32, 8, 128, "bf16", 256, 1, False, {"fused_reduce": False}),
    ([700, 3000], 3072, 16, 4, 128, "fp16", 16, 4, True, {}),
    ([32768], 32768, 32, 8, 128, "bf16", 0, 1, False, {}),
    ([5000, 2500], 5120, 8, 8, 64, "bf16", 64, 1, True, {"block_n": 128}),
]


def _kvcache_case(case, seed: int):
    lengths, cap, hq, hkv, d, dtype, page, sq, append, _ = case
    gen = torch.Generator().manual_seed(seed)
    b, dt = len(lengths), DTYPES[dtype]

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device="cuda", dtype=dt)

    dense_k, dense_v = rand(b, cap, hkv, d), rand(b, cap, hkv, d)
    q = rand(b, sq, hq, d)
    kn, vn = (rand(b, sq, hkv, d), rand(b, sq, hkv, d)) if append else (None, None)
    seqlens = torch.tensor([n - sq if append else n for n in lengths], dtype=torch.int32, device="cuda").clamp_min(0)
    table = None
    kc, vc = dense_k.clone(), dense_v.clone()
    if page:
        blocks = cap // page
        table = torch.randperm(b * blocks + 3, generator=gen)[: b * blocks].view(b, blocks).to("cuda", torch.int32)
        kc, vc = rand(b * blocks + 3, page, hkv, d), rand(b * blocks + 3, page, hkv, d)
        kc[table.flatten().long()] = dense_k.view(-1, page, hkv, d)
        vc[table.flatten().long()] = dense_v.view(-1, page, hkv, d)
    return q, kc, vc, kn, vn, seqlens, table, dense_k, dense_v


@pytest.mark.parametrize("case", KVCACHE, ids=lambda c: f"B{len(c[0])}-cap{c[1]}-d{c[4]}-{c[5]}-"
                         + (f"paged{c[6]}" if c[6] else "dense") + f"-sq{c[7]}" + ("-append" if c[8] else "")
                         + "".join(f"-{k}={v}" for k, v in c[9].items()))
def test_kvcache_matches_oracle(mod, case):
    q, kc, vc, kn, vn, seqlens, table, dense_k, dense_v = _kvcache_case(case, seed=case[1])
    causal = case[7] > 1
    cfg = mod.DecodeConfig(**case[9])
    out, lse = mod.kvcache_attention(q, kc, vc, kn, vn, cache_seqlens=seqlens, block_table=table, causal=causal,
                                     return_softmax_lse=True, config=cfg)
    check, lse_err = Check(), 0.0
    d = q.shape[-1]
    for i, n in enumerate(seqlens.tolist()):
        keys, vals = dense_k[i, :n], dense_v[i, :n]
        if kn is not None:
            keys, vals = torch.cat([keys, kn[i]]), torch.cat([vals, vn[i]])
            got_k = kc[table[i, n // kc.shape[1]].long(), n % kc.shape[1]] if table is not None else kc[i, n]
            assert torch.equal(got_k, kn[i, 0]), f"sequence {i}: the new key is not at position {n}"
        check.add(out[i], q[i], keys, vals, causal, d ** -0.5)
        if keys.shape[0]:
            want = lse_reference(q[i], keys, causal, d ** -0.5)
            lse_err = max(lse_err, (lse[i].double() - want).abs().max().item())
    within_rule(check.result())
    assert lse_err < 5e-2, lse_err


FP8_KVCACHE = [  # (lengths, capacity, Hq, Hkv, D, page size (0: dense), Sq, append, descale kind, format)
    ([8000, 1, 0, 4095], 8192, 32, 8, 128, 0, 1, True, "bh", torch.float8_e4m3fn),
    ([8000, 1, 0, 4095], 8192, 32, 8, 128, 256, 1, True, "tensor", torch.float8_e4m3fn),
    ([700, 3000], 3072, 16, 4, 128, 16, 4, True, "bh", torch.float8_e5m2),
    ([32768], 32768, 32, 8, 128, 0, 1, False, "bh", torch.float8_e4m3fn),
    ([5000, 2500], 5120, 8, 8, 64, 64, 1, True, "bh", torch.float8_e4m3fn),
]


@pytest.mark.parametrize("case", FP8_KVCACHE, ids=lambda c: f"B{len(c[0])}-cap{c[1]}-d{c[4]}-"
                         + (f"paged{c[5]}" if c[5] else "dense") + f"-sq{c[6]}" + ("-append" if c[7] else "")
                         + f"-{c[8]}-{str(c[9]).removeprefix('torch.float8_')}")
def test_fp8_kvcache_matches_the_dequantised_oracle(mod, case):
    """bf16 queries over an FP8 cache (x / descale): against fp64 attention over the dequantised cache the call left
    (appended rows included), error <= 2 x bf16 eager's over the same values; appended rows as torch's cast."""
    from kernel_ref import dequantized, fp8_cache

    lengths, cap, hq, hkv, d, page, sq, append, kind, fmt = case
    q, kc16, vc16, kn, vn, seqlens, table, dense_k, dense_v = _kvcache_case(
        (lengths, cap, hq, hkv, d, "bf16", page, sq, append, {}), seed=cap + d)
    b = len(lengths)
    gen = torch.Generator(device="cuda").manual_seed(1)
    if kind == "bh":
        kd = torch.rand(b, hkv, device="cuda", generator=gen) * 0.02 + 0.005
        vd = torch.rand(b, hkv, device="cuda", generator=gen) * 0.02 + 0.005
    else:
        kd, vd = torch.tensor([0.011], device="cuda"), torch.tensor([0.007], device="cuda")
    if kind == "tensor" or not page:
        kc, vc = fp8_cache(kc16, kd, fmt), fp8_cache(vc16, vd, fmt)
    else:  # a paged cache with per-sequence descales: each sequence's blocks at its own scale
        kc, vc = torch.zeros_like(kc16, dtype=fmt), torch.zeros_like(vc16, dtype=fmt)
        for i in range(b):
            rows = table[i].long()
            kc[rows] = fp8_cache(kc16[rows][None], kd[i : i + 1], fmt)[0]
            vc[rows] = fp8_cache(vc16[rows][None], vd[i : i + 1], fmt)[0]
    out = mod.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=seqlens, block_table=table, causal=sq > 1,
                                      k_descale=kd, v_descale=vd)
    check = Check()
    for i, n in enumerate(seqlens.tolist()):
        total = n + (sq if append else 0)
        k8 = kc[table[i].long()].flatten(0, 1) if page else kc[i]
        v8 = vc[table[i].long()].flatten(0, 1) if page else vc[i]
        kdi, vdi = (kd, vd) if kd.numel() == 1 else (kd[i : i + 1], vd[i : i + 1])
        keys, vals = dequantized(k8[None, :total], kdi)[0], dequantized(v8[None, :total], vdi)[0]
        if append:
            assert torch.equal(k8[n : n + sq].view(torch.uint8), fp8_cache(kn[i : i + 1], kdi, fmt)[0].view(torch.uint8))
        check.add(out[i], q[i], keys.to(q.dtype), vals.to(q.dtype), sq > 1, d ** -0.5, exact_kv=(keys, vals))
    within_rule(check.result())


def test_decode_step_replays_in_a_cuda_graph_with_changing_lengths(mod):
    """Captured once, replayed with new lengths, queries and new keys written into the same buffers."""
    case = ([4000, 100, 2000], 4096, 32, 8, 128, "bf16", 64, 1, True, {})
    q, kc, vc, kn, vn, seqlens, table, dense_k, dense_v = _kvcache_case(case, seed=7)
    call = lambda: mod.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=seqlens, block_table=table)  # noqa: E731
    call()  # compile and warm (and the merge counters exist before the capture)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    for step, lengths in enumerate(([3999, 99, 1999], [17, 4094, 0], [2500, 2500, 4095])):
        seqlens.copy_(torch.tensor(lengths, dtype=torch.int32))
        q.normal_()
        kn.normal_()
        vn.normal_()
        graph.replay()
        torch.cuda.synchronize()
        check = Check()
        for i, n in enumerate(lengths):
            flat_k = kc[table[i].long()].flatten(0, 1)
            flat_v = vc[table[i].long()].flatten(0, 1)
            assert torch.equal(flat_k[n], kn[i, 0]), (step, i)
            check.add(out[i], q[i], flat_k[: n + 1], flat_v[: n + 1], False, 128 ** -0.5)
        within_rule(check.result())


def test_static_cache_decode_runs_under_compile_reduce_overhead(mod):
    """transformers' production `generate` (static cache, torch.compile mode="reduce-overhead"): our call is the custom
    op attnprof::kvcache_attention inside inductor's CUDA-graph tree. On the H200 the split-merge counters, first made
    inside the tree's warm-up, were an untracked allocation of its pool (RuntimeError); the ring is made fresh here."""
    import importlib

    from attnprof.models.attention import register_variant
    from attnprof.models.kernel_cache import kernel_over_cache

    importlib.import_module(mod.__name__ + "._splits")._rings.clear()  # as in a fresh process
    register_variant(kernel_hub.kernel_variant())
    g = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=g)  # [B, Hq, Sq, D]
    k, v = (torch.randn(1, 8, 4096, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    mask = torch.zeros(1, 1, 1, 4096, dtype=torch.bool, device="cuda")
    step = lambda q, k, v, mask: kernel_over_cache(mod, "kernel", q, k, v, mask, 128 ** -0.5)  # noqa: E731
    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    for n in (3000, 3001, 17, 4096):  # the graph replays with the mask (the cache length) changing
        mask.zero_()
        mask[..., :n] = True
        got = compiled(q, k, v, mask).clone()
        want = torch.nn.functional.scaled_dot_product_attention(q.double(), k[:, :, :n].double(), v[:, :, :n].double(),
                                                                enable_gqa=True).transpose(1, 2)
        eager = torch.nn.functional.scaled_dot_product_attention(q, k[:, :, :n], v[:, :, :n],
                                                                 enable_gqa=True).transpose(1, 2)
        err = ((got.double() - want).norm() / want.norm()).item()
        base = ((eager.double() - want).norm() / want.norm()).item()
        assert err <= 2 * base + 1e-6, (n, err, base)


def test_fp8_cache_decode_runs_under_compile_reduce_overhead(mod):
    """The same over an FP8 (e4m3) cache with descales. The call's cached plan kept a 1.0 descale made inside the
    tree's warm-up ("Detected 1 tensor(s) in the cudagraph pool not tracked as outputs": `serve --kv-dtype fp8` on the
    H100); it is made outside the graph pools now (`_splits.one_on`)."""
    import importlib

    from attnprof.models.attention import register_variant
    from attnprof.models.kernel_cache import kernel_over_cache
    from attnprof.workload import Fp8KV

    splits = importlib.import_module(mod.__name__ + "._splits")
    splits._rings.clear()  # as in a fresh process
    splits._ones.clear()
    register_variant(kernel_hub.kernel_variant())
    g = torch.Generator(device="cuda").manual_seed(6)
    q = torch.randn(2, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=g)  # [B, Hq, Sq, D]
    k, v = (torch.randn(2, 8, 4096, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    kd, vd = (t.float().abs().amax(dim=(2, 3)) / 448 for t in (k, v))
    k8, v8 = ((t.float() / d[:, :, None, None]).to(torch.float8_e4m3fn) for t, d in ((k, kd), (v, vd)))
    fp8 = Fp8KV(k8, v8, kd, vd)
    kx, vx = (t.double() * d[:, :, None, None].double() for t, d in ((k8, kd), (v8, vd)))  # what the cache holds
    mask = torch.zeros(2, 1, 1, 4096, dtype=torch.bool, device="cuda")
    step = lambda q, mask: kernel_over_cache(mod, "kernel", q, k8, v8, mask, 128 ** -0.5, fp8=fp8)  # noqa: E731
    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    for n in (3000, 3001, 17, 4096):
        mask.zero_()
        mask[..., :n] = True
        got = compiled(q, mask).clone()
        want = torch.nn.functional.scaled_dot_product_attention(q.double(), kx[:, :, :n], vx[:, :, :n],
                                                                enable_gqa=True).transpose(1, 2)
        err = ((got.double() - want).norm() / want.norm()).item()
        assert err < 1e-2, (n, err)  # bf16 arithmetic over the dequantised cache


def test_no_host_sync_inside_a_call(mod):
    case = ([3000, 10], 4096, 32, 8, 128, "bf16", 64, 1, True, {})
    q, kc, vc, kn, vn, seqlens, table, *_ = _kvcache_case(case, seed=3)
    lq = [100, 0, 900]
    pq, cu = packed(lq, 32, 128, torch.bfloat16, "cuda")
    pk, _ = packed(lq, 8, 128, torch.bfloat16, "cuda")
    calls = [lambda: mod.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=seqlens, block_table=table),
             lambda: mod.flash_attn_varlen_func(pq, pk, pk, cu, cu, 900, 900, causal=True),
             lambda: mod.flash_attn_func(q, kc[:2], vc[:2], causal=True)]
    for call in calls:
        call()  # compile first: Triton's compile is not part of a step
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for call in calls:
            call()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_flash_attn_func_takes_the_decode_program_at_decode_shapes(mod):
    q = torch.randn(2, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 5000, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    assert mod.choose_config(q, k, True).label().startswith("decode")
    out = mod.flash_attn_func(q, k, v, causal=True)
    check = Check()
    for i in range(2):
        check.add(out[i], q[i], k[i], v[i], True, 128 ** -0.5)
    within_rule(check.result())


def test_continuous_batching_takes_the_decode_fast_path_on_our_kernel():
    """transformers' continuous batching (paged cache, CUDA) on our kernel: varlen for prefill, flash_attn_with_kvcache
    for decode-only batches; greedy tokens as the fp64 model picks them."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

    from attnprof.serving import flash_registration

    module = kernel_hub.load()
    calls: dict = {}
    originals = {name: getattr(module, name) for name in flash_registration.ENTRY_POINTS}
    try:
        for name, fn in originals.items():
            setattr(module, name, counting(fn, calls, name))
        gluon_refusals = []  # per prefill call: why the varlen Gluon program could not take it (None: it did)
        counted_varlen = module.flash_attn_varlen_func

        @functools.wraps(counted_varlen)
        def varlen(q, k, v, *args, **kwargs):
            gluon_refusals.append(module.gluon_varlen_unsupported(q, k, v, module.Config(**GLUON)))
            return counted_varlen(q, k, v, *args, **kwargs)

        module.flash_attn_varlen_func = varlen
        hub = flash_registration.hub_attention()
        assert hub.rejected is None and hub.decode_fast_path, hub
        ours = tiny_llama(torch.float16, hub.dense).cuda()
        ref = tiny_llama(torch.float64, "eager", ours).cuda()
        prompts = [[5, 6, 7, 8, 9], [10, 11, 12], list(range(20, 90))]
        gen = GenerationConfig(do_sample=False, max_new_tokens=8, eos_token_id=-1, pad_token_id=0)
        hub.apply(ours, paged=True)
        results = ours.generate_batch(prompts, generation_config=gen,
                                      continuous_batching_config=ContinuousBatchingConfig(num_blocks=32,
                                                                                          max_batch_tokens=128))
        hub.apply(ours)
    finally:
        for name, fn in originals.items():
            setattr(module, name, fn)
    assert calls.get("flash_attn_varlen_func", 0) > 0 and calls.get("flash_attn_with_kvcache", 0) > 0, calls
    if torch.cuda.get_device_capability() == (9, 0):  # its [total, H, D] views of [H, total, D]: the Gluon program
        assert None in gluon_refusals, set(gluon_refusals)
    for i, prompt in enumerate(prompts):
        r = results[f"req_{i}"]
        assert r.error is None and len(r.generated_tokens) == 8, (i, r.error)
        assert not greedy_mismatches(ref, prompt, list(r.generated_tokens)), i
