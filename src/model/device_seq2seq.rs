//! The paper's encoder-decoder ([`Seq2Seq`]) on a [`Device`]: greedy translation and beam
//! search, the blocks of `super::device_block` on both sides (the decoder's with their
//! cross-attention).
//!
//! A chunk of sentences is one encoder step (each source, EOS appended, attending to all of
//! itself, no padding), then the source's keys and values of every decoder layer are stored
//! once ([`DeviceCross::store`](super::device_block::DeviceCross)), then one decoder step per
//! output position over the rows still going (`super::device_decode`), each feeding its last
//! token (BOS first) and attending to its own target prefix and its whole source. The
//! log-softmax is taken on the device; the searches are the CPU's own ([`greedy_search`],
//! [`search_rows`]: the same choices, ties and stopping rule).

use super::config::NormPlacement;
use super::device_block::{
    check_block, check_cross, check_parts, run_stack, unsupported, upload_block,
    upload_decoder_layer, CrossSource, DeviceBlock, DeviceNorm, Parts,
};
use super::device_decode::DeviceDecodeState;
use super::device_rows::DeviceEmbedding;
use super::seq2seq::Seq2Seq;
use crate::backend::{Device, DeviceError, StepRows};
use crate::decode::beam::{search_rows, BeamHypothesis, BeamRules, BeamStop};
use crate::decode::greedy::{greedy_search, Hypothesis};
use crate::decode::TokenRules;
use crate::text::BOS;

/// A translation model's weights on a device.
pub struct DeviceSeq2Seq<D: Device> {
    pub device: D,
    pub(super) d_model: usize,
    pub(super) vocab: usize,
    pub(super) max_len: usize,
    /// The shared token table with its factor and positions, and the head.
    pub(super) embedding: DeviceEmbedding<D>,
    pub(super) post_ln: bool,
    pub(super) encoder: Vec<DeviceBlock<D>>,
    pub(super) encoder_norm: Option<DeviceNorm<D>>,
    pub(super) decoder: Vec<DeviceBlock<D>>,
    pub(super) decoder_norm: Option<DeviceNorm<D>>,
    /// `(n_kv_heads, d_head)` of the encoder's, the decoder's own and the cross attention.
    pub(super) encoder_shape: (usize, usize),
    pub(super) self_shape: (usize, usize),
    pub(super) cross_shape: (usize, usize),
}

impl<D: Device> DeviceSeq2Seq<D> {
    /// Uploads `model` to `device`, or names what it has that the device step does not do.
    pub fn new(device: D, model: &Seq2Seq<f32>) -> Result<DeviceSeq2Seq<D>, DeviceError> {
        let no = |what: String| unsupported(&device, what);
        let c = &model.config;
        let post_ln = c.norm == NormPlacement::PostLn;
        // Uploads read the float32 values, which `Seq2Seq::prepare_alone` releases.
        if model.embedding.is_released() || (model.encoder.layers.first())
            .is_some_and(|l| l.self_attn.q_proj.is_released())
        {
            return Err(no("a model whose float32 weights were released for the CPU \
                (Seq2Seq::prepare_alone): upload it before".into()));
        }
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
        if model.embedding.has_side_inputs() {
            return Err(no(
                "per-stack embedding inputs (mBART's and BART's decoder positions and \
                 embedding norms)"
                    .into(),
            ));
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
    pub(super) fn run(
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
    /// `limits[i]` tokens (EOS included), all in one batch, under `rules` (every row from BOS):
    /// the CPU's greedy search ([`greedy_search`]) over this model's rows.
    pub fn translate_greedy(
        &self,
        sources: &[&[u32]],
        limits: &[usize],
        rules: TokenRules,
    ) -> Result<Vec<Hypothesis>, DeviceError>
    where
        Self: Sync,
    {
        let rows = (sources.len(), super::device_lm::BLOCK_SIZE);
        let Some(mut state) = self.start_rows(sources, limits, rows)? else {
            return Ok(vec![Hypothesis::default(); sources.len()]);
        };
        let first = vec![BOS; sources.len()];
        let hyps = greedy_search(self, &mut state, &first, limits, rules);
        state.take_error()?;
        Ok(hyps)
    }

    /// Beam search of width `k` over `sources` (as [`translate_greedy`](Self::translate_greedy)):
    /// per sentence its `k` best hypotheses, best first, by the CPU's search ([`search_rows`])
    /// over this model's rows, whose beams share the blocks of their common prefix.
    pub fn translate_beam(
        &self,
        sources: &[&[u32]],
        limits: &[usize],
        k: usize,
        search: (f64, Option<BeamStop>, BeamRules),
        rules: TokenRules,
    ) -> Result<Vec<Vec<BeamHypothesis>>, DeviceError>
    where
        Self: Sync,
    {
        let k = k.max(1);
        let Some(mut state) = self.start_rows(sources, limits, (sources.len() * k, 1))? else {
            return Ok(vec![vec![BeamHypothesis::default()]; sources.len()]);
        };
        let first = vec![BOS; sources.len()];
        let (hyps, _) = search_rows(self, &mut state, &first, limits, k, search, rules);
        state.take_error()?;
        Ok(hyps)
    }

    /// The rows of a search over `sources` (checked) with up to `max_rows` rows at once in
    /// blocks of `block_size` positions, or `None` when no sentence may emit a token.
    fn start_rows(
        &self,
        sources: &[&[u32]],
        limits: &[usize],
        rows: (usize, usize),
    ) -> Result<Option<DeviceDecodeState<D>>, DeviceError> {
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
        let capacity = limits.iter().copied().max().unwrap_or(0).min(self.max_len);
        if capacity == 0 {
            return Ok(None);
        }
        self.start_decoding(sources, capacity, rows).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Host;
    use crate::decode::beam::{beam_search, beam_search_with, BeamOptions};
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

    fn check<D: Device>(m: &Seq2Seq<f32>, lm: &DeviceSeq2Seq<D>, tol: f64, what: &str)
    where
        DeviceSeq2Seq<D>: Sync,
    {
        let options = GreedyOptions {
            max_len_extra: 6,
            batch_size: 8,
        forced_first: None,
        min_len: 0,
        forced_end: false,
    };
        let srcs: Vec<Vec<u32>> = SOURCES.iter().map(|s| s.to_vec()).collect();
        let want = greedy_decode(m, &srcs, &options);
        let emitted: usize = want.iter().map(|h| h.token_logprobs.len()).sum();
        assert!(emitted >= 12, "{what}: {emitted} tokens emitted: a search worth comparing");
        let limits: Vec<usize> = SOURCES
            .iter()
            .map(|s| max_output_len(&m.config, s.len(), options.max_len_extra))
            .collect();
        let got = lm.translate_greedy(&SOURCES, &limits, TokenRules::TRANSLATION).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.tokens, w.tokens, "{what}: sentence {i}");
            assert_eq!(g.finished, w.finished, "{what}: sentence {i}");
            for (a, b) in g.token_logprobs.iter().zip(&w.token_logprobs) {
                assert!((a - b).abs() <= tol, "{what}: sentence {i}: {a} vs {b}");
            }
        }
        // Beam search of width 3: the CPU's 3-best lists (beams forking and dying, sharing
        // their prefixes' blocks), in chunks as the CPU's beam search cuts them.
        let beam = BeamOptions {
            beam_size: 3,
            nbest: 3,
            max_len_extra: options.max_len_extra,
            batch_size: 3,
            ..BeamOptions::default()
        };
        let want = beam_search(m, &srcs, &beam);
        let search = (beam.alpha, Some(beam.stop), beam.beam_rules);
        let got = beam_search_with(&m.config, &srcs, &beam, |s, l| lm.translate_beam(s, l, 3, search, TokenRules::TRANSLATION))
            .unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.len(), w.len(), "{what}: beam, sentence {i}");
            assert!(w.len() > 1, "{what}: beam, sentence {i}: an n-best list worth comparing");
            for (a, b) in g.iter().zip(w) {
                assert_eq!((&a.tokens, a.finished), (&b.tokens, b.finished), "{what}: beam {i}");
                assert!((a.score - b.score).abs() <= tol * 10.0, "{what}: beam {i}");
            }
        }
    }

    #[test]
    fn host_device_translations_are_the_models_greedy_and_beam_ones() {
        for (name, m) in models() {
            let lm = DeviceSeq2Seq::new(Host, &m).unwrap();
            check(&m, &lm, 1e-5, name);
            let e = lm.translate_greedy(&[&[29]], &[3], TokenRules::TRANSLATION).err().unwrap().to_string();
            assert!(e.contains("token id 29 is outside the vocabulary of 29"), "{e}");
        }
    }

    /// T5's relative position bias is not in the device step: refused by name, layer given.
    #[test]
    fn a_relative_position_bias_is_refused_by_name() {
        let mut c = ModelConfig::preset("tiny", 29).unwrap();
        (c.norm, c.positions) = (NormPlacement::PreLn, Positions::Relative);
        let m = Seq2Seq::<f32>::new(c, &mut Rng::new(1));
        let e = DeviceSeq2Seq::new(Host, &m).err().unwrap().to_string();
        assert!(e.contains("encoder layer 0: a relative position bias (T5's)"), "{e}");
    }

    /// Rows fork only over blocks of one position: forking greedy rows (blocks of 16) is an
    /// error the state keeps, a search stops at its next step without the device, and the
    /// caller takes the error.
    #[test]
    fn a_failed_step_is_kept_in_the_state_and_stops_the_search() {
        use crate::decode::{DecodingState, IncrementalDecoder};
        let (_, m) = models().remove(0);
        let lm = DeviceSeq2Seq::new(Host, &m).unwrap();
        let rows = (2, super::super::device_lm::BLOCK_SIZE);
        let mut state = lm.start_rows(&SOURCES[..2], &[5, 5], rows).unwrap().unwrap();
        let logprobs = lm.step(&mut state, &[BOS, BOS], &crate::model::StepLayout::dense());
        assert!(logprobs.iter().any(|&x| x != 0.0) && !state.failed());
        state.gather_rows(&[0, 0]);
        assert!(state.failed());
        let after = lm.step(&mut state, &[7, 7], &crate::model::StepLayout::dense());
        assert!(after.iter().all(|&x| x == 0.0));
        assert_eq!(state.len(), 1, "no step ran after the failure");
        let e = state.take_error().unwrap_err().to_string();
        assert!(e.contains("rows fork over blocks of 16 positions"), "{e}");
    }

    #[cfg(feature = "gpu")]
    #[test]
    fn gpu_translations_are_the_models_greedy_and_beam_ones() {
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
