//! The Gemma `config.json` reader's tests: every option a Gemma 2 or 3 config sets, and what
//! Gemma does not compute refused by name.

use super::*;

/// The Gemma 2 fixture's `config.json` (transformers 5), with `edit` applied.
fn gemma2_json(
    edit: impl FnOnce(&mut serde_json::Value),
) -> std::result::Result<ModelConfig, String> {
    let mut v = serde_json::json!({
        "model_type": "gemma2", "vocab_size": 512, "hidden_size": 128,
        "intermediate_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 256, "hidden_activation": "gelu_pytorch_tanh",
        "attn_logit_softcapping": 8.0, "final_logit_softcapping": 10.0,
        "query_pre_attn_scalar": 32, "sliding_window": 8, "tie_word_embeddings": true,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention",
                        "full_attention"],
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "use_bidirectional_attention": null
    });
    edit(&mut v);
    let parsed: GemmaConfig = serde_json::from_value(v).map_err(|e| e.to_string())?;
    parsed.model_config()
}

#[test]
fn a_gemma2_config_sets_every_option() {
    let c = gemma2_json(|_| {}).unwrap();
    assert_eq!(c.layer_windows, [Some(8), None, Some(8), None]);
    assert_eq!(
        (c.attn_logit_softcap, c.final_logit_softcap),
        (Some(8.0), Some(10.0))
    );
    assert_eq!(c.query_pre_attn_scalar, Some(32.0));
    assert_eq!(c.activation, Activation::GeluTanhGated);
    assert!(c.post_norms && c.tie_embeddings && !c.qk_norm);
    assert_eq!(c.norm_weight_offset, 1.0);
    assert_eq!(c.embedding_scale, Some(128f32.sqrt() as f64));
    assert_eq!((c.rope_base, c.sliding_rope_base), (10000.0, None));
    assert_eq!(c.rope_style, RopeStyle::HalfSplit);
    // Without layer_types, Gemma 2's even layers are the local ones.
    let c = gemma2_json(|v| {
        v.as_object_mut().unwrap().remove("layer_types");
        v["num_hidden_layers"] = 3.into();
    })
    .unwrap();
    assert_eq!(c.layer_windows, [Some(8), None, Some(8)]);
}

#[test]
fn a_gemma3_config_without_layer_types_has_five_local_layers_to_one_global() {
    let c = gemma2_json(|v| {
        v["model_type"] = "gemma3_text".into();
        v["num_hidden_layers"] = 7.into();
        v.as_object_mut().unwrap().remove("layer_types");
        v["attn_logit_softcapping"] = serde_json::Value::Null;
        v["rope_parameters"] = serde_json::json!({
            "full_attention": {"rope_theta": 1e6, "rope_type": "default"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}
        });
    });
    let c = c.unwrap();
    let w = Some(8);
    assert_eq!(c.layer_windows, [w, w, w, w, w, None, w]);
    assert_eq!((c.rope_base, c.sliding_rope_base), (1e6, Some(10000.0)));
    assert!(c.qk_norm && c.attn_logit_softcap.is_none());
    assert_eq!(c.rope_scaling, None);
    assert!(c.has_sliding_rope(0) && !c.has_sliding_rope(5));
    // transformers 4's way: rope_theta, rope_local_base_freq and a linear rope_scaling of
    // the global layers.
    let c = gemma2_json(|v| {
        v["model_type"] = "gemma3_text".into();
        v["num_hidden_layers"] = 6.into();
        let o = v.as_object_mut().unwrap();
        for k in ["layer_types", "rope_parameters"] {
            o.remove(k);
        }
        v["rope_theta"] = 1e6.into();
        v["rope_scaling"] = serde_json::json!({"rope_type": "linear", "factor": 8.0});
    })
    .unwrap();
    assert_eq!((c.rope_base, c.sliding_rope_base), (1e6, Some(10000.0)));
    let factors = vec![8.0; 16];
    assert_eq!(c.rope_scaling, Some(RopeScaling::FreqFactors { factors }));
}

#[test]
fn heads_of_their_own_width_are_read() {
    // Gemma 2 2B's shape: heads wider than hidden_size / num_attention_heads.
    let c = gemma2_json(|v| v["head_dim"] = 64.into()).unwrap();
    assert_eq!(c.head_dim, Some(64));
    let same = gemma2_json(|_| {}).unwrap();
    assert_eq!(same.head_dim, None);
}

#[test]
fn what_gemma_does_not_compute_is_refused_by_name() {
    type Edit = fn(&mut serde_json::Value);
    let cases: [(&str, Edit); 6] = [
        ("hidden_activation", |v| {
            v["hidden_activation"] = "gelu".into()
        }),
        ("attention_bias", |v| v["attention_bias"] = true.into()),
        ("use_bidirectional_attention", |v| {
            v["use_bidirectional_attention"] = true.into()
        }),
        ("tie_word_embeddings", |v| {
            v["tie_word_embeddings"] = false.into()
        }),
        ("layer_types", |v| {
            v["layer_types"] = serde_json::json!(["full_attention"])
        }),
        (
            "rope type",
            |v| v["rope_parameters"] = serde_json::json!({"rope_theta": 1e4, "rope_type": "yarn"}),
        ),
    ];
    for (name, edit) in cases {
        let err = gemma2_json(edit).unwrap_err();
        assert!(err.contains(name), "{name}: {err}");
    }
    let err = gemma2_json(|v| v["layer_types"][1] = "chunked_attention".into()).unwrap_err();
    assert!(err.contains("chunked_attention"), "{err}");
    let err = gemma2_json(|v| v["model_type"] = "gemma".into()).unwrap_err();
    assert!(err.contains("gemma"), "{err}");
}
