//! The BERT encoder ([`Bert`]) on a [`Device`]: the same blocks as the language model's step
//! (`super::device_block`), post-LN, each token attending to every token of its own sequence
//! (no causal mask: a token's context is its whole sequence, whose keys and values are all
//! stored before any attends), several sequences in one step without padding.
//!
//! `x = LayerNorm((E_word[t] + E_type[0]) + E_pos[i])`, the blocks, then on the host the mean of
//! each sequence's last hidden states, L2-normalised ([`mean_pool_l2`]).

use super::bert::{mean_pool_l2, Bert};
use super::device_block::{check_block, run_stack, unsupported, upload_block, DeviceBlock, DeviceNorm};
use super::device_rows::{kv_blocks, Layout};
use super::norm::Norm;
use crate::backend::{Device, DeviceError, WeightSource};

/// A BERT encoder's weights on a device.
pub struct DeviceBert<D: Device> {
    pub device: D,
    d_model: usize,
    vocab: usize,
    max_positions: usize,
    n_kv_heads: usize,
    d_head: usize,
    words: D::Weight,
    types: D::Weight,
    positions: D::Weight,
    norm: DeviceNorm<D>,
    blocks: Vec<DeviceBlock<D>>,
}

impl<D: Device> DeviceBert<D> {
    /// Uploads `bert` to `device`, or names what its blocks have that the device step does not
    /// do.
    pub fn new(device: D, bert: &Bert<f32>) -> Result<DeviceBert<D>, DeviceError> {
        let c = &bert.config;
        let layers = &bert.encoder.layers;
        let Some(first) = layers.first() else {
            return Err(unsupported(&device, "an encoder without layers".into()));
        };
        let (n_kv_heads, d_head) = (first.self_attn.n_kv_heads, first.self_attn.d_head);
        for (i, l) in layers.iter().enumerate() {
            if let Some(problem) = check_block(l, true, (n_kv_heads, d_head)) {
                return Err(unsupported(&device, format!("layer {i}: {problem}")));
            }
        }
        let d = c.hidden_size;
        let blocks = layers
            .iter()
            .enumerate()
            .map(|(i, l)| upload_block(&device, i, l))
            .collect::<Result<_, _>>()?;
        let norm = Norm::Layer(bert.embeddings_norm.clone());
        Ok(DeviceBert {
            d_model: d,
            vocab: c.vocab_size,
            max_positions: c.max_position_embeddings,
            n_kv_heads,
            d_head,
            words: device.weight("word_embeddings", &[WeightSource::floats(&bert.word_embeddings.value.data, c.vocab_size, d)])?,
            types: device.weight(
                "token_type_embeddings",
                &[WeightSource::floats(&bert.token_type_embeddings.value.data, c.type_vocab_size, d)],
            )?,
            positions: device.weight(
                "position_embeddings",
                &[WeightSource::floats(&bert.position_embeddings.value.data, c.max_position_embeddings, d)],
            )?,
            norm: DeviceNorm::upload(&device, &norm)?,
            blocks,
            device,
        })
    }

    /// The last hidden states of each sequence, `[len, d_model]` (token type 0), all
    /// sequences in one step.
    pub fn hidden(&self, seqs: &[&[u32]]) -> Result<Vec<Vec<f32>>, DeviceError> {
        let d = &self.device;
        let bad = |what: String| DeviceError::Device(format!("device encoder: {what}"));
        if let Some(s) = seqs.iter().find(|s| s.is_empty() || s.len() > self.max_positions) {
            return Err(bad(format!(
                "a sequence of {} tokens (1 to {} positions)",
                s.len(),
                self.max_positions
            )));
        }
        if let Some(t) = seqs.iter().flat_map(|s| s.iter()).find(|&&t| t as usize >= self.vocab) {
            return Err(bad(format!("token id {t} is outside the vocabulary of {}", self.vocab)));
        }
        if seqs.is_empty() {
            return Ok(Vec::new());
        }
        // Token i of sequence b at position p: its row's blocks are b's own, its context the
        // whole sequence.
        let lens: Vec<usize> = seqs.iter().map(|s| s.len()).collect();
        let (layout, blocks) = Layout::whole_sequences(&lens);
        let n = layout.pos.len();
        let ids: Vec<u32> = seqs.concat();
        let (ids, zeros, step) = (d.upload_ids(&ids)?, d.upload_ids(&vec![0; n])?, layout.upload(d)?);
        let dm = self.d_model;
        // (word + type) + position, in the reference's order; then the embeddings' norm.
        let (mut word, mut typ, mut at) = (d.zeros(n * dm)?, d.zeros(n * dm)?, d.zeros(n * dm)?);
        d.gather(&mut word, &ids, &self.words)?;
        d.gather(&mut typ, &zeros, &self.types)?;
        d.gather(&mut at, &step.pos, &self.positions)?;
        let mut sum = d.zeros(n * dm)?;
        d.add(&mut sum, &word, &typ)?;
        d.add(&mut word, &sum, &at)?;
        let mut h = d.zeros(n * dm)?;
        d.norm(self.norm.of(), &word, &mut h)?;
        let kv_shape = (self.n_kv_heads, self.d_head);
        let mut kv = kv_blocks(d, self.blocks.len(), blocks, kv_shape)?;
        let rows = step.rows();
        let hidden = run_stack(d, &self.blocks, true, None, kv_shape, (h, dm), &rows, &mut kv, None)?;
        let hidden = d.read(&hidden)?;
        let mut out = Vec::with_capacity(seqs.len());
        let mut at = 0;
        for s in seqs {
            out.push(hidden[at * dm..(at + s.len()) * dm].to_vec());
            at += s.len();
        }
        Ok(out)
    }

    /// Sentence embeddings: each sequence's mean hidden state, L2-normalised, as
    /// [`Bert::embed`] computes them.
    pub fn embed(&self, seqs: &[&[u32]]) -> Result<Vec<Vec<f32>>, DeviceError> {
        let dm = self.d_model;
        Ok(self
            .hidden(seqs)?
            .iter()
            .map(|rows| mean_pool_l2(rows, dm))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Host;
    use crate::model::bert::BertConfig;
    use crate::rng::Rng;

    fn bert(seed: u64) -> Bert<f32> {
        let json = br#"{"vocab_size": 50, "hidden_size": 24, "num_hidden_layers": 2,
            "num_attention_heads": 4, "intermediate_size": 40, "max_position_embeddings": 40}"#;
        let config = BertConfig::from_json(json, std::path::Path::new("config.json")).unwrap();
        let mut m = Bert::new(config, &mut Rng::new(seed));
        // Norm gains and biases away from 1 and 0, so that a swapped parameter shows.
        let mut rng = Rng::new(seed + 1);
        for (name, p) in crate::model::Module::params_mut(&mut m) {
            if name.contains("norm") || name.ends_with("bias") {
                for v in p.value.data.iter_mut() {
                    *v = rng.uniform_range(-0.5, 1.5) as f32;
                }
            }
        }
        m
    }

    const SEQS: [&[u32]; 4] = [
        &[2, 9, 14, 3, 3, 40, 49],
        &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19],
        &[7],
        &[
            5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27,
            28, 29, 30, 31, 32, 33, 34, 35, 36, 37,
        ],
    ];

    fn assert_close(got: &[Vec<f32>], want: &[Vec<f32>], tol: f32, what: &str) {
        for (s, (g, w)) in got.iter().zip(want).enumerate() {
            assert_eq!(g.len(), w.len(), "{what} {s}");
            for (a, b) in g.iter().zip(w) {
                assert!((a - b).abs() <= tol, "{what} sequence {s}: {a} vs {b}");
            }
        }
    }

    /// The host device's embeddings of sequences of 1 to 33 tokens (several blocks, no
    /// padding) are the model's own, padded and masked.
    #[test]
    fn host_device_embeddings_are_the_models() {
        let m = bert(3);
        let want = m.embed(&SEQS).unwrap();
        let host = DeviceBert::new(Host, &m).unwrap();
        assert_close(&host.embed(&SEQS).unwrap(), &want, 1e-5, "host");
        let e = host.embed(&[&[50]]).unwrap_err().to_string();
        assert!(e.contains("token id 50 is outside the vocabulary of 50"), "{e}");
        let e = host.embed(&[&[]]).unwrap_err().to_string();
        assert!(e.contains("a sequence of 0 tokens (1 to 40 positions)"), "{e}");
    }

    #[cfg(feature = "gpu")]
    #[test]
    fn gpu_embeddings_are_the_host_devices() {
        use crate::backend::GpuDevice;
        if transformer_gpu::testing::gpu().is_none() {
            return;
        }
        let m = bert(4);
        let want = DeviceBert::new(Host, &m).unwrap().embed(&SEQS).unwrap();
        let gpu = DeviceBert::new(GpuDevice::open(None).unwrap(), &m).unwrap();
        assert_close(&gpu.embed(&SEQS).unwrap(), &want, 1e-5, "gpu");
    }
}
