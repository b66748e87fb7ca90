//! [`ModelConfig::validate`]: the invariants the model relies on, and the options of the later
//! families (rope scaling, sliding windows, Gemma's) checked by name.

use super::{
    Activation, AttentionSite, ModelConfig, NormPlacement, Normalization, Positions, RopeScaling, MAX_CONTEXT,
    MAX_LAYERS,
};

impl ModelConfig {
    /// Checks the invariants the model relies on; the message names the offending field.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("d_model", self.d_model),
            ("n_heads", self.n_heads),
            ("d_ff", self.d_ff),
            ("max_len", self.max_len),
        ];
        for (name, n) in [
            ("n_encoder_layers", self.n_encoder_layers),
            ("n_decoder_layers", self.n_decoder_layers),
        ] {
            if n > MAX_LAYERS {
                return Err(format!("{name} {n} is above the supported {MAX_LAYERS}"));
            }
        }
        for (name, v) in positive {
            if v == 0 {
                return Err(format!("{name} must be positive"));
            }
        }
        if self.max_len > MAX_CONTEXT {
            return Err(format!(
                "max_len {} is above the supported {MAX_CONTEXT} (2^24 positions: a context \
                 is a limit, but positions and block tables are counted in 32-bit integers)",
                self.max_len
            ));
        }
        if self.vocab_size < 4 {
            return Err("vocab_size must hold the 4 special tokens".into());
        }
        if let Some(d) = self.head_dim {
            if d == 0 || d > 1 << 16 {
                return Err(format!("head_dim {d} must be in 1 ..= 65536"));
            }
        } else if !self.d_model.is_multiple_of(self.n_heads) {
            return Err(format!(
                "d_model {} is not divisible by n_heads {}",
                self.d_model, self.n_heads
            ));
        }
        if !self.d_model.is_multiple_of(2) {
            return Err(format!(
                "d_model {} must be even for sinusoidal positions",
                self.d_model
            ));
        }
        if self.positions == Positions::Rotary && !self.d_head().is_multiple_of(2) {
            return Err(format!(
                "the head width d_model / n_heads (or head_dim) = {} must be even for rotary positions",
                self.d_head()
            ));
        }
        for (name, p) in [
            ("dropout", self.dropout),
            ("attention_dropout", self.attention_dropout),
            ("activation_dropout", self.activation_dropout),
        ] {
            if !(0.0..1.0).contains(&p) {
                return Err(format!("{name} {p} must be in [0, 1)"));
            }
        }
        if self.layer_norm_eps.is_nan() || self.layer_norm_eps <= 0.0 {
            return Err("layer_norm_eps must be positive".into());
        }
        if let Some(kv) = self.n_kv_heads {
            if kv == 0 || !self.n_heads.is_multiple_of(kv) {
                return Err(format!(
                    "n_kv_heads {kv} must divide n_heads {} (each key/value head serves a \
                     group of query heads)",
                    self.n_heads
                ));
            }
        }
        if !(self.rope_base.is_finite() && self.rope_base > 1.0) {
            return Err(format!(
                "rope_base {} must be a number above 1",
                self.rope_base
            ));
        }
        if self.qk_norm_whole && !self.qk_norm {
            return Err("qk_norm_whole without qk_norm (no query/key norms to widen)".into());
        }
        self.validate_layer_heads()?;
        self.validate_experts()?;
        self.validate_relative_positions()?;
        self.validate_hybrid()?;
        self.validate_family_options()
    }

    /// The hybrid stack's options ([`gated_delta`](Self::gated_delta), [`rotary_dim`](
    /// Self::rotary_dim), [`attn_output_gate`](Self::attn_output_gate)): one layer type per
    /// decoder layer, value heads in whole groups per key head, positive widths and taps, an
    /// even rotated width within the head, a decoder-only model without pruned heads.
    fn validate_hybrid(&self) -> Result<(), String> {
        if let Some(r) = self.rotary_dim {
            if r == 0 || !r.is_multiple_of(2) || r > self.d_head() {
                return Err(format!(
                    "rotary_dim {r} must be even and in 2 ..= the head width {}",
                    self.d_head()
                ));
            }
        }
        if self.attention_sinks && (self.n_encoder_layers > 0 || !self.layer_heads.is_empty()) {
            return Err("attention_sinks (one logit per head) are for unpruned decoder-only \
                        models"
                .into());
        }
        let hybrid = self.gated_delta.is_some() || self.attn_output_gate || self.rotary_dim.is_some();
        if hybrid && (self.n_encoder_layers > 0 || !self.layer_heads.is_empty()) {
            return Err("gated_delta, attn_output_gate and rotary_dim are for unpruned \
                        decoder-only models"
                .into());
        }
        let Some(g) = &self.gated_delta else {
            return Ok(());
        };
        if g.layers.len() != self.n_decoder_layers {
            return Err(format!(
                "gated_delta.layers has {} entries for {} layers",
                g.layers.len(),
                self.n_decoder_layers
            ));
        }
        for (name, n) in [
            ("key_heads", g.key_heads),
            ("d_key", g.d_key),
            ("value_heads", g.value_heads),
            ("d_value", g.d_value),
            ("conv_kernel", g.conv_kernel),
        ] {
            if n == 0 || n > 1 << 16 {
                return Err(format!("gated_delta.{name} {n} must be in 1 ..= 65536"));
            }
        }
        if !g.value_heads.is_multiple_of(g.key_heads) {
            return Err(format!(
                "gated_delta.value_heads {} must be a multiple of key_heads {} (each key head \
                 serves a group of value heads)",
                g.value_heads, g.key_heads
            ));
        }
        if (0..self.n_decoder_layers).any(|i| g.is_delta(i) && self.layer_attention_kind(i) != super::AttentionKind::Exact) {
            return Err("a Gated DeltaNet layer with a layer_attention kind".into());
        }
        Ok(())
    }

    /// [`Positions::Relative`] (T5): an encoder-decoder with unpruned heads and softmax
    /// attention (linear attention has no scores to bias), buckets that
    /// split as T5's do (`n ≥ 4`: a bidirectional half keeps `n/4 ≥ 1` exact offsets), offsets
    /// told apart past the exact ones (`max_distance > n/2`); the bucket sizes are only read
    /// with relative positions.
    fn validate_relative_positions(&self) -> Result<(), String> {
        let (n, m) = self.relative_buckets;
        if self.positions != Positions::Relative {
            if self.relative_buckets != super::T5_BUCKETS {
                return Err("relative_buckets without relative positions".into());
            }
            return Ok(());
        }
        if self.n_encoder_layers == 0 {
            return Err("relative positions are computed for encoder-decoders only (T5)".into());
        }
        if !self.layer_heads.is_empty() {
            return Err("pruned heads (layer_heads) with relative positions are not supported".into());
        }
        let kinds = self.layer_attention.iter().chain(&self.encoder_layer_attention);
        if kinds.into_iter().any(|k| *k == super::AttentionKind::Linear) {
            return Err("linear attention (layer_attention) has no scores to bias: not with \
                        relative positions"
                .into());
        }
        if !(4..=1 << 16).contains(&n) || m <= n / 2 || m > MAX_CONTEXT {
            return Err(format!(
                "relative_buckets ({n}, {m}): T5's buckets need 4 to 65536 buckets and a \
                 max_distance above half of them (and at most {MAX_CONTEXT})"
            ));
        }
        Ok(())
    }

    /// Whether a model of this config can be trained here (`train`, fine-tuning): not with
    /// relative positions, whose bias table gets no gradient from the attention kernels.
    pub fn check_trainable(&self) -> Result<(), String> {
        if self.gated_delta.is_some() || self.attn_output_gate || self.rotary_dim.is_some() {
            return Err("a hybrid linear-attention model (Gated DeltaNet layers, gated and \
                        partially rotated attention: Qwen3.5) cannot be trained here: those \
                        layers are computed for inference only"
                .into());
        }
        if self.positions == Positions::Relative {
            return Err("positions \"relative\" (T5's relative position bias) cannot be trained \
                        here: the attention kernels pass no gradient to the bias table, so T5 \
                        models load for inference only (translate, score, serve)"
                .into());
        }
        Ok(())
    }

    /// [`experts`](Self::experts): at least one expert of a positive width, `1 ..= n_experts`
    /// of them per token, in a decoder-only model (the translation layers' FFNs are dense).
    fn validate_experts(&self) -> Result<(), String> {
        let Some(e) = self.experts else {
            return Ok(());
        };
        if e.n_experts == 0 || e.n_experts > 1 << 16 {
            return Err(format!("experts.n_experts {} must be in 1 ..= 65536", e.n_experts));
        }
        if e.top_k == 0 || e.top_k > e.n_experts {
            return Err(format!(
                "experts.top_k {} must be in 1 ..= n_experts {}",
                e.top_k, e.n_experts
            ));
        }
        if e.d_ff == 0 {
            return Err("experts.d_ff must be positive".into());
        }
        if e.shared_d_ff == Some(0) {
            return Err("experts.shared_d_ff must be positive (or absent: no shared expert)".into());
        }
        if let Some(c) = e.swiglu_clamp {
            if self.activation != Activation::SiluGated {
                return Err("experts.swiglu_clamp clamps the SwiGLU: it needs activation \
                            silu-gated"
                    .into());
            }
            if !(c.alpha.is_finite() && c.limit.is_finite() && c.limit > 0.0) {
                return Err(format!(
                    "experts.swiglu_clamp alpha {} and limit {} must be finite, the limit positive",
                    c.alpha, c.limit
                ));
            }
        }
        if self.n_encoder_layers > 0 {
            return Err(
                "experts (a mixture-of-experts FFN) are for decoder-only models; this config \
                 has encoder layers"
                    .into(),
            );
        }
        Ok(())
    }

    /// [`layer_heads`](Self::layer_heads): one count per layer of its site, each in
    /// `1 ..= n_heads` and a whole number of key/value groups.
    fn validate_layer_heads(&self) -> Result<(), String> {
        let group = self.n_heads / self.n_kv_heads.unwrap_or(self.n_heads);
        for site in AttentionSite::ALL {
            let heads = self.layer_heads.of(site);
            let layers = self.site_layers(site);
            if !heads.is_empty() && heads.len() != layers {
                return Err(format!(
                    "layer_heads.{} has {} entries for {layers} layers",
                    site.name(),
                    heads.len()
                ));
            }
            for (i, &h) in heads.iter().enumerate() {
                if h == 0 || h > self.n_heads || !h.is_multiple_of(group) {
                    return Err(format!(
                        "layer_heads.{} gives layer {i} {h} heads: it must keep 1 ..= n_heads {} \
                         heads, whole groups of {group} sharing a key/value head",
                        site.name(),
                        self.n_heads
                    ));
                }
            }
        }
        Ok(())
    }

    /// The options later model families need: refuses those not computed yet, by name, and
    /// values out of range, so that no config is silently computed as another model.
    fn validate_family_options(&self) -> Result<(), String> {
        self.validate_rope_scaling()?;
        if self.layer_windows.contains(&Some(0)) {
            return Err(
                "layer_windows asks for a window of 0 keys (a query must see at least itself)"
                    .into(),
            );
        }
        if !self.layer_windows.is_empty() && self.layer_windows.len() != self.n_decoder_layers {
            return Err(format!(
                "layer_windows has {} entries for {} decoder layers",
                self.layer_windows.len(),
                self.n_decoder_layers
            ));
        }
        self.validate_attention_kinds()?;
        if let Some(c) = self.final_logit_softcap {
            if !(c.is_finite() && c > 0.0) {
                return Err(format!("final_logit_softcap {c} must be a positive number"));
            }
        }
        self.validate_gemma_options()?;
        self.validate_dense_options()?;
        if (self.embedding_norm || self.target_positions) && self.n_encoder_layers == 0 {
            return Err(
                "embedding_norm and target_positions are encoder-decoder options (mBART, BART)"
                    .into(),
            );
        }
        if self.target_positions && self.positions != Positions::Learned {
            return Err(format!(
                "target_positions needs learned positions, not {:?}",
                self.positions
            ));
        }
        if let Some(s) = self.embedding_scale {
            if !s.is_finite() {
                return Err(format!("embedding_scale {s} must be a finite number"));
            }
        }
        if self.norm_weight_offset != 0.0 {
            if !self.norm_weight_offset.is_finite() {
                return Err(format!(
                    "norm_weight_offset {} must be a finite number",
                    self.norm_weight_offset
                ));
            }
            if self.normalization != Normalization::RmsNorm {
                return Err(
                    "norm_weight_offset with layer_norm is not supported yet (RMSNorm only)".into(),
                );
            }
        }
        Ok(())
    }

    /// [`rope_scaling`](Self::rope_scaling): rotary positions only, finite positive values,
    /// one factor per rotated pair.
    fn validate_rope_scaling(&self) -> Result<(), String> {
        let Some(scaling) = &self.rope_scaling else {
            return Ok(());
        };
        if self.positions != Positions::Rotary {
            return Err("rope_scaling is set but the positions are not rotary".into());
        }
        let positive = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(format!("rope_scaling {name} {v} must be a positive number"))
            }
        };
        match scaling {
            &RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                positive("factor", factor)?;
                positive("low_freq_factor", low_freq_factor)?;
                positive("high_freq_factor", high_freq_factor)?;
                positive(
                    "original_max_position_embeddings",
                    original_max_position_embeddings,
                )?;
                if low_freq_factor >= high_freq_factor {
                    return Err(format!(
                        "rope_scaling low_freq_factor {low_freq_factor} must be below \
                         high_freq_factor {high_freq_factor}"
                    ));
                }
            }
            &RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                attention_factor,
                truncate: _,
            } => {
                positive("factor", factor)?;
                positive(
                    "original_max_position_embeddings",
                    original_max_position_embeddings,
                )?;
                positive("beta_fast", beta_fast)?;
                positive("beta_slow", beta_slow)?;
                positive("attention_factor", attention_factor)?;
            }
            &RopeScaling::Linear { factor } => positive("factor", factor)?,
            RopeScaling::FreqFactors { factors } => {
                if factors.len() != self.d_head() / 2 {
                    return Err(format!(
                        "rope_scaling has {} frequency factors for {} rotated pairs per head",
                        factors.len(),
                        self.d_head() / 2
                    ));
                }
                for &f in factors {
                    positive("frequency factor", f)?;
                }
            }
        }
        Ok(())
    }
}

impl ModelConfig {
    /// The SmolLM3, Granite and OLMo 2 options: decoder-only models; one `layer_rope` entry
    /// per layer of a rotary model; positive finite factors; sublayers without input norms in
    /// pre-LN blocks only.
    fn validate_dense_options(&self) -> Result<(), String> {
        let set = [
            ("layer_rope", !self.layer_rope.is_empty()),
            ("residual_scale", self.residual_scale.is_some()),
            ("logit_divisor", self.logit_divisor.is_some()),
            ("input_norms false", !self.input_norms),
        ];
        if let Some((name, _)) = set.iter().find(|(_, on)| *on) {
            if self.n_encoder_layers > 0 {
                return Err(format!(
                    "{name} is a decoder-only option (language models), not computed in an \
                     encoder-decoder"
                ));
            }
        }
        if !self.layer_rope.is_empty() {
            if self.positions != Positions::Rotary {
                return Err("layer_rope is set but the positions are not rotary".into());
            }
            if self.layer_rope.len() != self.n_decoder_layers {
                return Err(format!(
                    "layer_rope has {} entries for {} decoder layers",
                    self.layer_rope.len(),
                    self.n_decoder_layers
                ));
            }
        }
        for (name, value) in [
            ("residual_scale", self.residual_scale),
            ("logit_divisor", self.logit_divisor),
        ] {
            if let Some(v) = value.filter(|v| !(v.is_finite() && *v > 0.0)) {
                return Err(format!("{name} {v} must be a positive number"));
            }
        }
        if !self.input_norms && self.norm != NormPlacement::PreLn {
            return Err("input_norms false needs pre-LN blocks (norm pre-ln)".into());
        }
        Ok(())
    }

    /// The Gemma 2 / Gemma 3 options: positive finite numbers, post-norms on pre-LN blocks.
    fn validate_gemma_options(&self) -> Result<(), String> {
        let positive = [
            ("attn_logit_softcap", self.attn_logit_softcap),
            ("query_pre_attn_scalar", self.query_pre_attn_scalar),
            ("sliding_rope_base", self.sliding_rope_base),
        ];
        for (name, value) in positive {
            if let Some(v) = value.filter(|v| !(v.is_finite() && *v > 0.0)) {
                return Err(format!("{name} {v} must be a positive number"));
            }
        }
        if let Some(b) = self.sliding_rope_base.filter(|&b| b <= 1.0) {
            return Err(format!("sliding_rope_base {b} must be a number above 1"));
        }
        if self.post_norms && self.norm != NormPlacement::PreLn {
            return Err("post_norms needs pre-LN blocks (norm pre-ln)".into());
        }
        Ok(())
    }
}

impl ModelConfig {
    /// `layer_attention` and `encoder_layer_attention`: one entry per layer, sizes of at least
    /// 1, no layer with both a `layer_windows` window and another kind, and linear attention
    /// without what it cannot compute (attention dropout, soft-capped scores: there are no
    /// weights or scores to drop or cap).
    fn validate_attention_kinds(&self) -> Result<(), String> {
        use crate::model::attention_kind::AttentionKind;
        let lists = [
            (
                "layer_attention",
                &self.layer_attention,
                self.n_decoder_layers,
                "decoder",
            ),
            (
                "encoder_layer_attention",
                &self.encoder_layer_attention,
                self.n_encoder_layers,
                "encoder",
            ),
        ];
        for (name, kinds, layers, stack) in lists {
            if !kinds.is_empty() && kinds.len() != layers {
                return Err(format!(
                    "{name} has {} entries for {layers} {stack} layers",
                    kinds.len()
                ));
            }
            for (i, kind) in kinds.iter().enumerate() {
                kind.validate(&format!("{name}[{i}]"))?;
                if *kind == AttentionKind::Linear {
                    if self.attention_dropout > 0.0 {
                        return Err(format!(
                            "{name}[{i}] is linear attention, which has no weights to drop: \
                             attention_dropout must be 0"
                        ));
                    }
                    if self.attn_logit_softcap.is_some() {
                        return Err(format!(
                            "{name}[{i}] is linear attention, which has no scores to cap: \
                             attn_logit_softcap cannot be set"
                        ));
                    }
                }
            }
        }
        for (i, kind) in self.layer_attention.iter().enumerate() {
            let windowed = self.layer_windows.get(i).copied().flatten().is_some();
            if windowed && *kind != AttentionKind::Exact {
                return Err(format!(
                    "decoder layer {i} has both a layer_windows window and layer_attention \
                     {}: state one",
                    kind.label()
                ));
            }
        }
        Ok(())
    }
}
