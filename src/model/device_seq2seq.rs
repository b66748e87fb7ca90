//! The paper's encoder-decoder ([`Seq2Seq`]) on a [`Device`]: greedy translation, the blocks of
//! `super::device_block` on both sides (the decoder's with their cross-attention).
//!
//! A chunk of sentences is one encoder step (each source, EOS appended, attending to all of
//! itself, no padding), then the source's keys and values of every decoder layer are stored
//! once ([`DeviceCross::store`](super::device_block::DeviceCross)), then one decoder step per
//! output position over the sentences still going, each feeding its last token (BOS first)
//! and attending to its own target prefix and its whole source. The log-softmax is taken on
//! the device; each row's next token is [`advance`]'s arg-max over the tokens translation
//! allows, as the CPU's greedy search picks it.

use super::config::NormPlacement;
use super::device_block::{
    check_block, check_cross, check_parts, run_stack, unsupported, upload_block,
    upload_decoder_layer, CrossSource, DeviceBlock, DeviceNorm, Parts,
};
use super::device_rows::{kv_blocks, DeviceEmbedding, Layout, BLOCK_SIZE};
use super::seq2seq::Seq2Seq;
use crate::backend::{Device, DeviceError, StepRows};
use crate::decode::greedy::{advance, Hypothesis};
use crate::decode::TokenRules;
use crate::text::{BOS, EOS};

/// A translation model's weights on a device.
pub struct DeviceSeq2Seq<D: Device> {
    pub device: D,
    d_model: usize,
    vocab: usize,
    max_len: usize,
    /// The shared token table with its factor and positions, and the head.
    embedding: DeviceEmbedding<D>,
    post_ln: bool,
    encoder: Vec<DeviceBlock<D>>,
    encoder_norm: Option<DeviceNorm<D>>,
    decoder: Vec<DeviceBlock<D>>,
    decoder_norm: Option<DeviceNorm<D>>,
    /// `(n_kv_heads, d_head)` of the encoder's, the decoder's own and the cross attention.
    encoder_shape: (usize, usize),
    self_shape: (usize, usize),
    cross_shape: (usize, usize),
}

impl<D: Device> DeviceSeq2Seq<D> {
    /// Uploads `model` to `device`, or names what it has that the device step does not do.
    pub fn new(device: D, model: &Seq2Seq<f32>) -> Result<DeviceSeq2Seq<D>, DeviceError> {
        let no = |what: String| unsupported(&device, what);
        let c = &model.config;
        let post_ln = c.norm == NormPlacement::PostLn;
        let (Some(e0), Some(d0)) = (model.encoder.layers.first(), model.decoder.layers.first()) else {
            return Err(no("a model without encoder or decoder layers".into()));
        };
        let encoder_shape = (e0.self_attn.n_kv_heads, e0.self_attn.d_head);
        let self_shape = (d0.self_attn.n_kv_heads, d0.self_attn.d_head);
        let cross_shape = (d0.cross_attn.n_kv_heads, d0.cross_attn.d_head);
        for (i, l) in model.encoder.layers.iter().enumerate() {
            if let Some(p) = check_block(l, post_ln, encoder_shape) {
                return Err(no(format!("encoder layer {i}: {p}")));
            }
        }
        for (i, l) in model.decoder.layers.iter().enumerate() {
            let parts = Parts {
                attn: &l.self_attn,
                attn_res: &l.self_attn_res,
                ffn: &l.ffn,
                ffn_res: &l.ffn_res,
            };
            let cross = (l.cross_attn.n_kv_heads, l.cross_attn.d_head) != cross_shape;
            if let Some(p) = check_parts(&parts, post_ln, self_shape)
                .or_else(|| check_cross(l))
                .or(cross.then_some("cross-attention heads of another shape than layer 0's"))
            {
                return Err(no(format!("decoder layer {i}: {p}")));
            }
        }
        let norm = |n: &Option<super::norm::Norm<f32>>| n.as_ref().map(|n| DeviceNorm::upload(&device, n)).transpose();
        let encoder = (model.encoder.layers.iter().enumerate())
            .map(|(i, l)| upload_block(&device, i, l))
            .collect::<Result<_, _>>()?;
        let decoder = (model.decoder.layers.iter().enumerate())
            .map(|(i, l)| upload_decoder_layer(&device, i, l))
            .collect::<Result<_, _>>()?;
        if model.head.softcap.is_some() {
            return Err(no("a soft cap of the logits".into()));
        }
        Ok(DeviceSeq2Seq {
            d_model: c.d_model,
            vocab: c.vocab_size,
            max_len: c.max_len,
            embedding: DeviceEmbedding::upload(&device, &model.embedding, &model.head, c.max_len)?,
            post_ln,
            encoder,
            encoder_norm: norm(&model.encoder.final_norm)?,
            decoder,
            decoder_norm: norm(&model.decoder.final_norm)?,
            encoder_shape,
            self_shape,
            cross_shape,
            device,
        })
    }

    /// [`run_stack`] with this model's placement and width.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        h: D::Tensor,
        blocks: &[DeviceBlock<D>],
        final_norm: Option<&DeviceNorm<D>>,
        shape: (usize, usize),
        rows: &StepRows<'_, D>,
        kv: &mut [D::Kv],
        source: Option<&CrossSource<'_, D>>,
    ) -> Result<D::Tensor, DeviceError> {
        let (d, dm) = (&self.device, self.d_model);
        run_stack(d, blocks, self.post_ln, final_norm, shape, (h, dm), rows, kv, source)
    }

    /// Greedy translations of `sources` (without EOS), sentence `i` emitting at most
    /// `limits[i]` tokens (EOS included), all in one batch.
    pub fn translate_greedy(
        &self,
        sources: &[&[u32]],
        limits: &[usize],
    ) -> Result<Vec<Hypothesis>, DeviceError> {
        let d = &self.device;
        let bad = |what: String| DeviceError::Device(format!("device translation: {what}"));
        if limits.len() != sources.len() {
            return Err(bad(format!("{} limits for {} sources", limits.len(), sources.len())));
        }
        if let Some(s) = sources.iter().find(|s| s.len() + 1 > self.max_len) {
            return Err(bad(format!("a source of {} tokens (the model takes {})", s.len(), self.max_len - 1)));
        }
        if let Some(t) = sources.iter().flat_map(|s| s.iter()).find(|&&t| t as usize >= self.vocab) {
            return Err(bad(format!("token id {t} is outside the vocabulary of {}", self.vocab)));
        }
        let mut hyps = vec![Hypothesis::default(); sources.len()];
        let mut live: Vec<usize> = (0..sources.len()).filter(|&i| limits[i] > 0).collect();
        if live.is_empty() {
            return Ok(hyps);
        }
        // The encoder: every source (EOS appended) in one step.
        let src: Vec<Vec<u32>> = sources.iter().map(|s| [s, &[EOS][..]].concat()).collect();
        let lens: Vec<usize> = src.iter().map(Vec::len).collect();
        let (enc, enc_blocks) = Layout::whole_sequences(&lens);
        let enc_ids = enc.upload(d)?;
        let enc_rows = enc_ids.rows();
        let mut enc_kv = kv_blocks(d, self.encoder.len(), enc_blocks, self.encoder_shape)?;
        let h = self.embedding.embed(d, &d.upload_ids(&src.concat())?, &enc_ids.pos, enc.pos.len())?;
        let memory = self.run(h, &self.encoder, self.encoder_norm.as_ref(), self.encoder_shape, &enc_rows, &mut enc_kv, None)?;
        drop(enc_kv);
        // The source's keys and values of every decoder layer, once.
        let mut cross_kv = kv_blocks(d, self.decoder.len(), enc_blocks, self.cross_shape)?;
        let width = self.cross_shape.0 * self.cross_shape.1;
        for (block, kv) in self.decoder.iter().zip(cross_kv.iter_mut()) {
            let cross = block.cross.as_ref().expect("decoder layers have cross-attention");
            cross.store(d, &memory, &enc_rows, width, kv)?;
        }
        // The decoder: one step per position, the rows still going.
        let capacity = limits.iter().copied().max().unwrap_or(1).min(self.max_len);
        let per_row = capacity.div_ceil(BLOCK_SIZE);
        let mut self_kv = kv_blocks(d, self.decoder.len(), per_row * sources.len(), self.self_shape)?;
        let src_blocks: Vec<&[u32]> = (0..sources.len()).map(|r| enc.row_of(&lens, r)).collect();
        let mut feed: Vec<u32> = vec![BOS; live.len()];
        let mut step = 0usize;
        while !live.is_empty() {
            if step >= capacity {
                return Err(bad(format!("{step} positions: past the capacity of {capacity}")));
            }
            let n = live.len();
            let own = Layout {
                pos: vec![step as u32; n],
                ctx: vec![step as u32 + 1; n],
                table: live.iter().flat_map(|&r| (0..per_row as u32).map(move |b| (r * per_row) as u32 + b)).collect(),
                max_blocks: per_row,
            };
            let cross = Layout {
                pos: vec![0; n],
                ctx: live.iter().map(|&r| lens[r] as u32).collect(),
                table: live.iter().flat_map(|&r| src_blocks[r].iter().copied()).collect(),
                max_blocks: enc.max_blocks,
            };
            let (own_ids, cross_ids) = (own.upload(d)?, cross.upload(d)?);
            let source = CrossSource {
                kv: &cross_kv,
                rows: cross_ids.rows(),
                shape: self.cross_shape,
            };
            let h = self.embedding.embed(d, &d.upload_ids(&feed)?, &own_ids.pos, n)?;
            let hidden = self.run(h, &self.decoder, self.decoder_norm.as_ref(), self.self_shape, &own_ids.rows(), &mut self_kv, Some(&source))?;
            let mut logits = d.zeros(n * self.vocab)?;
            d.product(&mut logits, &hidden, n, self.embedding.head())?;
            let mut logprobs = d.zeros(n * self.vocab)?;
            d.log_softmax(&logits, &mut logprobs, self.vocab)?;
            let logprobs = d.read(&logprobs)?;
            let mut next = Vec::with_capacity(n);
            let mut keep = Vec::with_capacity(n);
            for (j, &r) in live.iter().enumerate() {
                let row = &logprobs[j * self.vocab..(j + 1) * self.vocab];
                let (token, go_on) = advance(&mut hyps[r], row, limits[r], TokenRules::TRANSLATION);
                if go_on {
                    next.push(token);
                    keep.push(r);
                }
            }
            (live, feed) = (keep, next);
            step += 1;
        }
        Ok(hyps)
    }
}


#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Host;
    use crate::decode::greedy::{greedy_decode, max_output_len, GreedyOptions};
    use crate::model::{Module, ModelConfig, Positions};
    use crate::rng::Rng;

    /// The paper's post-LN shape with sinusoids and a pre-LN one with learned positions and
    /// an untied head, random weights made sharp enough that greedy choices have margins.
    fn models() -> Vec<(&'static str, Seq2Seq<f32>)> {
        let cases = [
            ("post-LN sinusoidal", NormPlacement::PostLn, Positions::Sinusoidal, true),
            ("pre-LN learned untied", NormPlacement::PreLn, Positions::Learned, false),
        ];
        cases
            .into_iter()
            .enumerate()
            .map(|(i, (name, norm, positions, tied))| {
                let mut c = ModelConfig::preset("tiny", 29).unwrap();
                (c.d_model, c.n_heads, c.d_ff, c.max_len, c.dropout) = (24, 4, 40, 40, 0.0);
                (c.norm, c.positions, c.tie_embeddings) = (norm, positions, tied);
                c.validate().unwrap();
                let mut m = Seq2Seq::<f32>::new(c, &mut Rng::new(7 + i as u64));
                for (n, p) in m.params_mut() {
                    let f = if n.contains("embedding") || n.contains("output_proj") { 3.0 } else { 1.0 };
                    p.value.data.iter_mut().for_each(|v| *v *= f);
                }
                m.prepare_inference();
                (name, m)
            })
            .collect()
    }

    const SOURCES: [&[u32]; 4] = [
        &[5, 9, 14, 3, 7],
        &[4],
        &[10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 8],
        &[6, 6, 6],
    ];

    fn check<D: Device>(m: &Seq2Seq<f32>, lm: &DeviceSeq2Seq<D>, tol: f64, what: &str) {
        let options = GreedyOptions {
            max_len_extra: 6,
            batch_size: 8,
        };
        let srcs: Vec<Vec<u32>> = SOURCES.iter().map(|s| s.to_vec()).collect();
        let want = greedy_decode(m, &srcs, &options);
        let emitted: usize = want.iter().map(|h| h.token_logprobs.len()).sum();
        assert!(emitted >= 12, "{what}: {emitted} tokens emitted: a search worth comparing");
        let limits: Vec<usize> = SOURCES
            .iter()
            .map(|s| max_output_len(&m.config, s.len(), options.max_len_extra))
            .collect();
        let got = lm.translate_greedy(&SOURCES, &limits).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.tokens, w.tokens, "{what}: sentence {i}");
            assert_eq!(g.finished, w.finished, "{what}: sentence {i}");
            for (a, b) in g.token_logprobs.iter().zip(&w.token_logprobs) {
                assert!((a - b).abs() <= tol, "{what}: sentence {i}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn host_device_translations_are_the_models_greedy_ones() {
        for (name, m) in models() {
            let lm = DeviceSeq2Seq::new(Host, &m).unwrap();
            check(&m, &lm, 1e-5, name);
            let e = lm.translate_greedy(&[&[29]], &[3]).err().unwrap().to_string();
            assert!(e.contains("token id 29 is outside the vocabulary of 29"), "{e}");
        }
    }

    #[cfg(feature = "gpu")]
    #[test]
    fn gpu_translations_are_the_models_greedy_ones() {
        use crate::backend::GpuDevice;
        if transformer_gpu::testing::gpu().is_none() {
            return;
        }
        for (name, m) in models() {
            let lm = DeviceSeq2Seq::new(GpuDevice::open(None).unwrap(), &m).unwrap();
            check(&m, &lm, 1e-4, name);
        }
    }
}
