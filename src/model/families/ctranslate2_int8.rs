//! A CTranslate2 model's int8 weights as stored (`weight` int8 `[rows, cols]`, `weight_scale`
//! f32 `[rows]`, `w ≈ q / scale`): dequantised for f32 inference, and kept as our
//! [`Int8Matrix`] (`w ≈ q · s`, `s = 1 / scale`) to multiply as they are in int8 inference
//! ([`StoredInt8::install`]), instead of quantising the dequantised floats again.

use crate::backend::{Int8Matrix, PackedWeight};
use crate::model::linear::Linear;
use crate::model::Seq2Seq;
use crate::store::ctranslate2::{Dtype, Variable};
use crate::text::id_map::IdMap;

/// The int8 rows of one stored weight.
#[derive(Clone, Debug)]
pub struct Rows {
    q: Vec<i8>,
    /// CTranslate2's `weight_scale` per row.
    scale: Vec<f32>,
    cols: usize,
}

impl Rows {
    /// Rows `range` as an [`Int8Matrix`].
    pub fn rows(&self, range: std::ops::Range<usize>) -> Result<Int8Matrix, String> {
        let q = &self.q[range.start * self.cols..range.end * self.cols];
        let s: Vec<f32> = self.scale[range].iter().map(|&x| 1.0 / x).collect();
        Int8Matrix::from_quantized(q, &s, s.len(), self.cols)
    }

    /// All rows in our token order (a projection over the vocabulary): our own rows are zero.
    pub fn reordered(&self, ids: &IdMap, d: usize) -> Result<Int8Matrix, String> {
        let q: Vec<f32> = self.q.iter().map(|&v| f32::from(v)).collect();
        let q: Vec<i8> = ids.reorder_rows(&q, d, 0.0).iter().map(|&v| v as i8).collect();
        let inv: Vec<f32> = self.scale.iter().map(|&x| 1.0 / x).collect();
        let s = ids.reorder_rows(&inv, 1, 0.0);
        Int8Matrix::from_quantized(&q, &s, s.len(), d)
    }
}

/// The weight `v` (int8 or int16, named `name`, its `weight_scale` values `scale`: one per row
/// or one for all) dequantised as CTranslate2 dequantises it (`q / scale` in f32), and its int8
/// rows when int8.
pub fn dequantise(name: &str, v: &Variable, scale: &[f32]) -> Result<(Vec<f32>, Option<Rows>), String> {
    let (rows, cols) = match v.shape[..] {
        [r, c] => (r, c),
        [n] => (n, 1),
        _ => return Err(format!("{name} has shape {:?}, not a matrix", v.shape)),
    };
    let per_row = match scale.len() {
        1 => vec![scale[0]; rows],
        n if n == rows => scale.to_vec(),
        n => return Err(format!("{name}_scale has {n} values for {rows} rows")),
    };
    if let Some(bad) = per_row.iter().find(|s| !s.is_finite() || **s == 0.0) {
        return Err(format!("{name}_scale holds {bad}, not a usable scale"));
    }
    let q = v.to_f32();
    let w = q
        .chunks_exact(cols.max(1))
        .zip(&per_row)
        .flat_map(|(row, &s)| row.iter().map(move |&x| x / s))
        .collect();
    let rows_kept = (v.dtype == Dtype::I8 && v.shape.len() == 2).then(|| Rows {
        q: v.as_i8().expect("int8"),
        scale: per_row,
        cols,
    });
    Ok((w, rows_kept))
}

/// The int8 weights of a loaded model, by our layer names (`encoder.layers.0.self_attn.q_proj`),
/// and the output projection's.
#[derive(Clone, Debug, Default)]
pub struct StoredInt8 {
    pub linears: Vec<(String, Result<Int8Matrix, String>)>,
    pub head: Option<Result<Int8Matrix, String>>,
}

impl StoredInt8 {
    /// Whether any weight was stored as int8.
    pub fn is_some(&self) -> bool {
        !self.linears.is_empty() || self.head.is_some()
    }

    /// How many linear layers (and the projection) multiply stored rows.
    pub fn weights(&self) -> usize {
        self.linears.len() + usize::from(self.head.is_some())
    }

    /// Makes `model`'s layers multiply these rows (for int8 inference: call before
    /// `prepare_precision(Int8)`, which then packs only the others).
    pub fn install(self, model: &mut Seq2Seq<f32>) -> Result<(), String> {
        for (name, m) in self.linears {
            let m = m.map_err(|e| format!("{name}: {e}"))?;
            let layer = linear_mut(model, &name).ok_or_else(|| format!("no layer {name}"))?;
            layer.set_packed(PackedWeight::Int8(m))?;
        }
        if let Some(m) = self.head {
            let m = m.map_err(|e| format!("the output projection: {e}"))?;
            model.head.set_packed(PackedWeight::Int8(m))?;
        }
        Ok(())
    }
}

/// The linear layer of our name `name` (`{encoder,decoder}.layers.{i}.{self_attn,cross_attn}.
/// {q,k,v,out}_proj` or `….ffn.linear{1,2}`).
fn linear_mut<'a>(model: &'a mut Seq2Seq<f32>, name: &str) -> Option<&'a mut Linear<f32>> {
    let parts: Vec<&str> = name.split('.').collect();
    let [stack, "layers", i, module, layer] = parts[..] else {
        return None;
    };
    let i: usize = i.parse().ok()?;
    let attn = |a: &'a mut crate::model::attention::MultiHeadAttention<f32>| match layer {
        "q_proj" => Some(&mut a.q_proj),
        "k_proj" => Some(&mut a.k_proj),
        "v_proj" => Some(&mut a.v_proj),
        "out_proj" => Some(&mut a.out_proj),
        _ => None,
    };
    let ffn = |f: &'a mut crate::model::feed_forward::FeedForward<f32>| match layer {
        "linear1" => Some(&mut f.linear1),
        "linear2" => Some(&mut f.linear2),
        _ => None,
    };
    match (stack, module) {
        ("encoder", "self_attn") => attn(&mut model.encoder.layers.get_mut(i)?.self_attn),
        ("encoder", "ffn") => match &mut model.encoder.layers.get_mut(i)?.ffn {
            crate::model::experts::Ffn::Dense(f) => ffn(f),
            _ => None,
        },
        ("decoder", "self_attn") => attn(&mut model.decoder.layers.get_mut(i)?.self_attn),
        ("decoder", "cross_attn") => attn(&mut model.decoder.layers.get_mut(i)?.cross_attn),
        ("decoder", "ffn") => ffn(&mut model.decoder.layers.get_mut(i)?.ffn),
        _ => None,
    }
}
