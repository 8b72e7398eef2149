"""Tiny configs of every text model type in the installed mlx-lm (``mlx_lm/models/``).

``FAMILIES`` maps a module name to the ``config.json`` of a tiny random-weight model of it
(hidden size 64 or so, 2-4 layers, the byte tokenizer's 259 ids, hybrids given at least
one layer of each kind); ``SKIPPED`` maps every other module to the reason it has no
entry. ``tests.kvcache.family_weights.write_family(path, name)`` writes a loadable
model folder (config, weights, tokenizer) for the engine, as
:func:`core.models.tiny_model.write_tiny_model` does for its kinds.
``tests/core/engine/test_model_matrix.py`` holds every module of the installed mlx-lm to
one of the two tables.

Weights (tests/kvcache/family_weights.py) are mlx-lm's own initialisation of each model
(its ``Model`` built from the config), with a little seeded noise on every parameter that
starts constant (norms at 1, biases and gates at 0, decay rates, per-channel scales...): a
model whose constant start makes some path ignore its context (a state that never
updates, a gate stuck shut) would agree with itself with or without a cache by accident,
and the matrix would prove nothing. An untied output head is scaled up so greedy replies
have clear top-1 margins, and gives logits only to printable ASCII and newline, so
replies are readable text.
"""

from __future__ import annotations

from core.models.tiny_model import VOCAB_SIZE

# Every config starts from these (a model's ModelArgs takes the names it knows)
BASE = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rms_norm_eps=1e-5,
    norm_eps=1e-5,
    layer_norm_eps=1e-5,
    layer_norm_epsilon=1e-5,
    max_position_embeddings=2048,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    attention_bias=False,
    mlp_bias=False,
    # mixture of experts
    num_experts=4,
    n_routed_experts=4,
    num_local_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    n_shared_experts=1,
    num_shared_experts=1,
    shared_expert_intermediate_size=32,
    first_k_dense_replace=1,
    n_group=1,
    topk_group=1,
    routed_scaling_factor=1.0,
    norm_topk_prob=True,
    moe_layer_freq=1,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    # multi-head latent attention
    kv_lora_rank=16,
    q_lora_rank=16,
    qk_rope_head_dim=8,
    qk_nope_head_dim=16,
    v_head_dim=16,
)
YARN = {
    "beta_fast": 32,
    "beta_slow": 1,
    "factor": 4,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 512,
    "type": "yarn",
}
MAMBA = dict(
    mamba_n_heads=4,
    mamba_d_head=16,
    mamba_d_state=8,
    mamba_d_conv=4,
    mamba_n_groups=1,
    mamba_proj_bias=False,
    mamba_conv_bias=True,
    mamba_expand=2,
    mamba_d_ssm=64,
    mamba_chunk_size=16,
)
SW = 16  # sliding windows: smaller than the prompts, so the windows really slide


def per_layer_type(**params) -> dict:
    """RoPE parameters keyed by layer type, as some configs give them."""
    return {
        kind: {"rope_theta": 10000.0, "rope_type": "default", **params}
        for kind in ("sliding_attention", "full_attention")
    }


FAMILIES: dict[str, dict] = {
    "Klear": {},
    "afm7": dict(hidden_dim=64, num_layers=3, num_kv_reuse_layers=1, num_heads=4, num_kv_heads=2),
    "afmoe": dict(
        layer_types=["sliding_attention", "full_attention"], num_dense_layers=1, sliding_window=SW
    ),
    "apertus": dict(post_norm=False, qk_norm=True),
    "baichuan_m1": dict(sliding_window=SW, sliding_window_layers=[0], conv_window=2),
    "bailing_hybrid": dict(layer_group_size=2, group_norm_size=1),
    "bailing_moe": {},
    "bailing_moe_linear": dict(layer_group_size=2, group_norm_size=1),
    "bailing_moe_v3": dict(layer_group_size=2, moe_shared_expert_intermediate_size=32),
    "bitnet": {},
    "cohere": {},
    "cohere2": dict(sliding_window=SW, sliding_window_pattern=2),
    "dbrx": dict(
        d_model=64,
        n_layers=2,
        n_heads=4,
        ffn_config={"ffn_hidden_size": 64, "moe_num_experts": 4, "moe_top_k": 2},
        attn_config={"kv_n_heads": 2, "clip_qkv": 8.0, "rope_theta": 10000},
    ),
    "deepseek": {},
    "deepseek_v2": dict(rope_scaling=YARN),
    "deepseek_v3": {},
    "deepseek_v41": dict(
        head_dim=32,
        num_attention_heads=4,
        o_groups=2,
        o_lora_rank=16,
        sliding_window=SW,
        compress_ratios=[0, 4],
        kv_source_layer_ids=[1],
        index_source_layer_ids=[1],
        index_n_heads=2,
        index_head_dim=16,
        index_topk=4,
        candidate_topk_blocks=0,
        hc_mult=2,
        rms_norm_eps=1e-6,
    ),
    "deepseek_v32": dict(index_head_dim=16, index_n_heads=2, index_topk=16),
    "dots1": {},
    "ernie4_5": dict(use_bias=False),
    "ernie4_5_moe": dict(use_bias=False, moe_num_experts=4, moe_k=2, moe_layer_start_index=1),
    "exaone": dict(num_layers=2),
    "exaone4": dict(
        rope_scaling=None,
        sliding_window=SW,
        sliding_window_pattern="LG",
        layer_types=["sliding_attention", "full_attention"],
    ),  # transformers' reading of it
    "exaone_moe": dict(
        sliding_window=SW,
        layer_types=["sliding_attention", "full_attention"],
        is_moe_layer=[False, True],
    ),
    "falcon_h1": dict(MAMBA, mlp_expansion_factor=2, num_hidden_layers=2),
    "gear": dict(layer_types=["sliding_attention", "full_attention"], sliding_window=SW),
    "gemma": {},
    "gemma2": dict(query_pre_attn_scalar=16),
    "gemma3n": dict(
        text_config=dict(
            BASE,
            model_type="gemma3n_text",
            num_hidden_layers=4,
            num_kv_shared_layers=2,
            vocab_size_per_layer_input=VOCAB_SIZE,
            sliding_window=SW,
            rope_local_base_freq=10000.0,
            final_logit_softcapping=30.0,
            layer_types=["sliding_attention", "full_attention"] * 2,
            activation_sparsity_pattern=[0.0] * 4,
            hidden_size_per_layer_input=8,
            altup_num_inputs=2,
            altup_coef_clip=120.0,
            altup_correct_scale=True,
            altup_active_idx=0,
            laurel_rank=8,
        )
    ),
    "gemma3_text": dict(sliding_window=SW, sliding_window_pattern=2, query_pre_attn_scalar=16),
    "gemma4_text": dict(
        num_hidden_layers=4,
        global_head_dim=32,
        num_kv_shared_layers=2,
        hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=VOCAB_SIZE,
        sliding_window=SW,
        sliding_window_pattern=2,
    ),
    "glm": {},
    "glm4": dict(partial_rotary_factor=0.5),
    "glm4_moe": dict(rope_scaling=None, use_qk_norm=True, partial_rotary_factor=0.5),
    "glm4_moe_lite": {},
    "glm_moe_dsa": dict(
        index_head_dim=16,
        index_n_heads=2,
        index_topk=16,
        topk_method="noaux_tc",
        scoring_func="sigmoid",
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
    ),
    "gpt2": dict(n_ctx=2048, n_embd=64, n_head=4, n_layer=2, n_positions=2048),
    "gpt_bigcode": dict(n_embd=64, n_layer=2, n_inner=128, n_head=4, n_positions=2048),
    "gpt_neox": dict(rotary_emb_base=10000, rotary_pct=0.25),
    "gpt_oss": dict(intermediate_size=64, sliding_window=SW),
    "gptj": dict(n_embd=64, n_head=4, rotary_dim=8, n_layer=2, n_positions=2048),
    "granite": dict(
        logits_scaling=1.0,
        attention_multiplier=0.25,
        embedding_multiplier=1.0,
        residual_multiplier=1.0,
    ),
    "granitemoe": dict(
        logits_scaling=1.0,
        attention_multiplier=0.25,
        embedding_multiplier=1.0,
        residual_multiplier=1.0,
    ),
    "granitemoehybrid": dict(
        MAMBA,
        logits_scaling=1.0,
        attention_multiplier=0.25,
        embedding_multiplier=1.0,
        residual_multiplier=1.0,
        layer_types=["mamba", "attention"],
        shared_intermediate_size=64,
        mamba_d_head=32,  # heads x head size = 2 x hidden (transformers checks it)
        num_local_experts=0,
    ),
    "helium": {},
    "hunyuan": dict(
        rope_scaling={"alpha": 1.0, "factor": 1.0, "type": "dynamic"},
        moe_topk=2,
        num_shared_expert=1,
        use_mixed_mlp_moe=True,
        use_qk_norm=True,
        use_cla=True,
        cla_share_factor=2,
    ),
    "hunyuan_v1_dense": {},
    "internlm2": {},
    "internlm3": {},
    "iquestloopcoder": dict(loop_num=2, loop_window_size=SW),
    "jamba": dict(
        attn_layer_offset=1,
        attn_layer_period=2,
        expert_layer_offset=1,
        expert_layer_period=2,
        mamba_d_conv=4,
        mamba_d_state=8,
        mamba_expand=2,
    ),
    "kimi_k3": dict(
        linear_attn_config={
            "kda_layers": [1],
            "full_attn_layers": [2],
            "num_heads": 4,
            "head_dim": 16,
            "short_conv_kernel_size": 4,
        },
        num_experts_per_token=2,
    ),
    "kimi_linear": dict(
        linear_attn_config={
            "kda_layers": [1],
            "full_attn_layers": [2],
            "num_heads": 4,
            "head_dim": 16,
            "short_conv_kernel_size": 4,
        },
        model_max_length=2048,
        num_experts_per_token=2,
    ),
    "laguna": dict(sliding_window=SW, layer_types=["sliding_attention", "full_attention"]),
    "lfm2": dict(
        conv_bias=False,
        conv_L_cache=3,
        block_dim=64,
        block_multiple_of=16,
        block_ffn_dim_multiplier=1.0,
        block_auto_adjust_ff_dim=False,
        block_ff_dim=128,
        full_attn_idxs=[1],
    ),
    "lfm2_moe": dict(
        conv_bias=False,
        conv_L_cache=3,
        use_expert_bias=True,
        num_dense_layers=1,
        full_attn_idxs=[1],
    ),
    "lille-130m": dict(block_size=2048, n_embd=64, n_head=4, n_kv_heads=2, n_layer=2),
    "llama": {},
    "llama4": dict(
        text_config=dict(
            BASE,
            model_type="llama4_text",
            num_hidden_layers=4,
            attention_chunk_size=SW,
            interleave_moe_layer_step=2,
            intermediate_size_mlp=128,
            rope_scaling=None,
            num_experts_per_tok=1,
            use_qk_norm=True,
        )
    ),
    "llama4_text": dict(intermediate_size_mlp=128, no_rope_layers=[1, 0], use_qk_norm=True),
    "longcat_flash": dict(
        attention_method="MLA",
        zero_expert_type="identity",
        ffn_hidden_size=128,
        moe_topk=2,
        expert_ffn_hidden_size=32,
        zero_expert_num=1,
        num_layers=2,
        mla_scale_q_lora=True,
        mla_scale_kv_lora=True,
    ),
    "longcat_flash_ngram": dict(
        ffn_hidden_size=128,
        moe_topk=2,
        expert_ffn_hidden_size=32,
        zero_expert_num=1,
        num_layers=2,
        mla_scale_q_lora=True,
        mla_scale_kv_lora=True,
        ngram_vocab_size_ratio=2,
    ),
    "mamba": dict(
        state_size=8, conv_kernel=4, use_bias=False, use_conv_bias=True, time_step_rank=4
    ),
    "mamba2": dict(
        num_heads=8,
        head_dim=16,
        state_size=16,
        n_groups=1,
        use_bias=False,
        use_conv_bias=True,
        conv_kernel=4,
        time_step_limit=[0.0, 1e9],
        time_step_rank=4,
    ),
    "mellum": dict(
        sliding_window=SW,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters=per_layer_type(),
    ),
    "mimo": dict(num_nextn_predict_layers=0),
    "mimo_v2_flash": dict(
        hybrid_layer_pattern=[1, 0],
        moe_layer_freq=[0, 1],
        add_swa_attention_sink_bias=True,
        add_full_attention_sink_bias=False,
        sliding_window_size=SW,
        topk_method="noaux_tc",
        scoring_func="sigmoid",
        layernorm_epsilon=1e-5,
        swa_rope_theta=10000.0,
        swa_num_attention_heads=4,
        swa_num_key_value_heads=2,
        swa_head_dim=16,
        swa_v_head_dim=16,
        partial_rotary_factor=0.5,
    ),
    "minicpm": dict(dim_model_base=64, scale_depth=1.0, scale_emb=1.0),
    "minicpm3": dict(
        dim_model_base=64,
        scale_depth=1.0,
        scale_emb=1.0,
        rope_scaling={
            "original_max_position_embeddings": 2048,
            "short_factor": [1.0] * 4,
            "long_factor": [1.0] * 4,
        },
    ),
    "minimax": dict(shared_intermediate_size=0, rotary_dim=8),
    "minimax_m3_vl": dict(
        text_config=dict(
            BASE,
            rotary_dim=8,
            dense_intermediate_size=128,
            shared_intermediate_size=32,
            intermediate_size=32,
            moe_layer_freq=[0, 1],
            sparse_attention_config={
                "sparse_num_index_heads": 2,
                "sparse_index_dim": 16,
                "sparse_block_size": 4,
                "sparse_topk_blocks": 2,
                "sparse_local_block": 1,
                "sparse_attention_freq": [0, 1],
            },
        )
    ),
    "ministral3": dict(
        rope_parameters={
            "rope_theta": 10000.0,
            "rope_type": "default",
            "llama_4_scaling_beta": 0.1,
            "original_max_position_embeddings": 512,
        }
    ),
    "mistral4": dict(
        rope_parameters={
            "rope_theta": 10000.0,
            "rope_type": "default",
            "llama_4_scaling_beta": 0.1,
            "original_max_position_embeddings": 512,
        }
    ),
    "mixtral": {},
    "muse_glimmer": dict(
        sliding_window=SW,
        layer_types=["sliding_attention", "full_attention"],
        layer_rope_theta=[10000.0, 10000.0],
    ),
    "muse_spark": dict(
        text_config=dict(
            BASE,
            post_norm_eps=1e-8,
            rope_parameters={"rope_theta": 10000.0},
            layer_rope_theta=[10000.0, 0],
            layer_types=["sliding_attention", "full_attention"],
            sliding_window=SW,
            final_logit_softcapping=30.0,
            output_multiplier=1.0,
            moe_hidden_size=32,
            num_shared_experts=0,
        )
    ),
    "nanbeige": {},
    "nanochat": {},
    "nemotron-nas": dict(
        num_hidden_layers=3,
        block_configs=[  # the middle layer has no attention, so no cache
            {"attention": {"n_heads_in_group": 2}, "ffn": {"ffn_mult": 2.0}},
            {"attention": {"no_op": True}, "ffn": {"ffn_mult": 2.0}},
            {"attention": {"n_heads_in_group": 4}, "ffn": {"ffn_mult": 1.0}},
        ],
    ),
    "nemotron": dict(hidden_act="relu2"),
    "nemotron_h": dict(
        hybrid_override_pattern=["M", "-", "*"],
        mamba_num_heads=4,
        mamba_head_dim=16,
        mamba_proj_bias=False,
        ssm_state_size=8,
        conv_kernel=4,
        n_groups=1,
        use_bias=False,
        use_conv_bias=True,
        time_step_limit=[0.0, 1e9],
    ),
    "olmo2": {},
    "olmo3": dict(sliding_window=SW, layer_types=["sliding_attention", "full_attention"]),
    "olmo_hybrid": dict(
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        linear_allow_neg_eigval=True,
        layer_types=["linear_attention", "full_attention"],
    ),
    "olmoe": {},
    "openelm": dict(
        num_transformer_layers=2,
        model_dim=64,
        ffn_dim_divisor=16,
        num_query_heads=[4, 4],
        num_kv_heads=[2, 2],
        ffn_multipliers=[1.0, 2.0],
    ),
    "phi": {},
    "phi3": {},
    # its output masks ids up to 100351 (its tokenizer's unused ones): a vocabulary that big
    "phi3small": dict(
        vocab_size=100352,
        dense_attention_every_n_layers=2,
        ff_intermediate_size=128,
        gegelu_limit=20.0,
        blocksparse_block_size=32,
        blocksparse_num_local_blocks=2,
        blocksparse_vert_stride=2,
    ),
    "phimoe": {},
    "phixtral": dict(num_vocab=VOCAB_SIZE, model_dim=64, num_heads=4, num_layers=2, rotary_dim=8),
    "plamo": dict(n_shared_head=2),
    "plamo2": dict(
        hidden_size_per_head=16,
        mamba_d_state=8,
        mamba_num_heads=4,
        mamba_step=2,
        mamba_chunk_size=16,
        attention_window_size=SW,
    ),
    # mlx-lm 0.32's plamo3 masks window + 1 tokens but keeps window in its RotatingKVCache:
    # past its window, a continued prompt (a cache's, or a chunked prefill's) gets logits ~2%
    # off a whole one's, and greedy replies with and without a cache part (traced: with the
    # mask's + 1 removed they agree). Its window here is wider than the tests' prompts.
    "plamo3": dict(window_size=256, sliding_window=256, sliding_window_pattern=2),
    "qwen": dict(kv_channels=16, no_bias=True),
    "qwen2": {},
    "qwen2_moe": {},
    "qwen3": {},
    "qwen3_5": dict(
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        full_attention_interval=2,
        rope_parameters={
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "rope_type": "default",
        },
    ),
    "qwen3_moe": {},
    "qwen3_next": dict(
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        partial_rotary_factor=0.5,
        full_attention_interval=2,
    ),
    "recurrent_gemma": dict(
        conv1d_width=4,
        logits_soft_cap=30.0,
        attention_window_size=SW,
        block_types=["recurrent", "attention"],
    ),
    "rwkv7": dict(a_low_rank_dim=8, v_low_rank_dim=8, gate_low_rank_dim=8, decay_low_rank_dim=8),
    "seed_oss": {},
    "smollm3": dict(no_rope_layer_interval=2),
    "solar_open": dict(partial_rotary_factor=1.0),
    "spark2_5": dict(
        sliding_window=SW,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters=per_layer_type(),
    ),
    "stablelm": dict(use_qkv_bias=False, partial_rotary_factor=0.5),
    "starcoder2": {},
    "step3p5": dict(
        num_attention_groups=2,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=SW,
        moe_num_experts=4,
        moe_top_k=2,
        share_expert_dim=32,
        moe_layers_enum="1",
    ),
    "talkie": {},
    "telechat3": {},
    "youtu_llm": {},
}

_HELPER = "a helper module, not a model"
_WRAPS = "the language model of a vision-language checkpoint: it wraps {} (covered)"
SKIPPED: dict[str, str] = {
    **{
        name: _HELPER
        for name in (
            "activations",
            "base",
            "bitlinear_layers",
            "cache",
            "gated_delta",
            "mla",
            "pipeline",
            "rope_utils",
            "ssm",
            "switch_layers",
        )
    },
    "olmo": "needs the ai2-olmo package (remote code), which mlx-lm does not install",
    "gemma3": _WRAPS.format("gemma3_text"),
    "gemma4": _WRAPS.format("gemma4_text"),
    "kimi_k25": _WRAPS.format("deepseek_v3"),
    "kimi_vl": _WRAPS.format("deepseek_v3"),
    "lfm2-vl": _WRAPS.format("lfm2"),
    "mistral3": _WRAPS.format("ministral3, mistral4 or llama"),
    "pixtral": _WRAPS.format("llama"),
    "qwen2_vl": _WRAPS.format("qwen2"),
    "qwen3_vl": _WRAPS.format("qwen3"),
    "qwen3_vl_moe": _WRAPS.format("qwen3_moe"),
    "qwen3_5_moe": "qwen3_5's model under another name (covered)",
    "prism_hadamard_qwen35": (
        "qwen3_5 over a Hadamard-rotated 2-bit pack that only its converter writes"
        " (covered as qwen3_5)"
    ),
}

# Families whose mlx-lm code runs Metal kernels only (mx.fast.metal_kernel, no fallback):
# their tests skip where Metal is not there
NEEDS_METAL = {
    "bitnet": "its BitLinear layers run a Metal kernel (mlx_lm/models/bitlinear_layers.py)",
    "muse_spark": "its norms and expert routing run Metal kernels (mlx_lm/kernels/)",
}
