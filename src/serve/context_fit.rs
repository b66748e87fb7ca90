//! The context a served language model runs with: `--ctx-size`, or what the key/value pool
//! holds (see [`fit_context`]).

use super::scheduler::EngineConfig;
use crate::model::LanguageModel;

/// The context of every sequence, sized by the pool of key/value blocks
/// (`--kv-memory-mib`), which every sequence shares: one sequence can never hold more than
///
/// `pool positions = pool_blocks · block_rows`
///
/// positions. Without `--ctx-size` the context is the model's own lowered to that (as
/// llama-server fits `n_ctx` to the memory it has), so a 128k or 1M-context file serves without
/// tables sized by a context no sequence could reach; an explicit `--ctx-size` (at most the
/// model's) above it is refused, naming the bytes one such sequence needs and the pool's.
pub(super) fn fit_context(
    model: &mut LanguageModel<f32>,
    ctx_size: Option<usize>,
    engine: &EngineConfig,
) -> std::result::Result<usize, String> {
    let pool_positions = engine.pool_blocks.saturating_mul(engine.block_rows);
    if pool_positions == 0 {
        return Err(format!(
            "--kv-memory-mib holds no block of {} positions of this model's keys and values \
             ({} bytes); raise it",
            engine.block_rows,
            EngineConfig::block_bytes(model, engine.block_rows)
        ));
    }
    let wanted = ctx_size.unwrap_or(usize::MAX).min(model.model_context());
    if ctx_size.is_some() && wanted > pool_positions {
        let per_position = EngineConfig::block_bytes(model, 1) as u128;
        return Err(format!(
            "--ctx-size {wanted}: one sequence's keys and values need {} bytes, more than the \
             {} bytes of the key/value pool (--kv-memory-mib, {pool_positions} positions); \
             raise --kv-memory-mib or lower --ctx-size",
            per_position * wanted as u128,
            per_position * pool_positions as u128,
        ));
    }
    model
        .set_context(wanted.min(pool_positions), None)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::scheduler::PrefillBudget;
    use crate::model::config::{ModelConfig, Positions};
    use crate::model::ShapesOnly;

    /// A 1M-context model of 2 layers with 2 key/value heads of 8 (256 bytes of keys and
    /// values a position, float32).
    fn model() -> LanguageModel<f32> {
        let mut c = ModelConfig::preset("tiny", 8).unwrap();
        (c.n_encoder_layers, c.n_decoder_layers) = (0, 2);
        (c.d_model, c.n_heads, c.n_kv_heads, c.d_ff, c.vocab_size) = (32, 4, Some(2), 16, 8);
        (c.positions, c.max_len) = (Positions::Rotary, 1 << 20);
        LanguageModel::new(c, &mut ShapesOnly)
    }

    fn engine(pool_blocks: usize, block_rows: usize) -> EngineConfig {
        EngineConfig {
            block_rows,
            pool_blocks,
            max_batch: 4,
            prefill_budget: PrefillBudget::Fixed(32),
            prefix_cache: false,
            max_overtakes: 0,
        }
    }

    /// Without --ctx-size the context is the pool's positions (a 1M model in a pool of 1,000
    /// blocks of 16); an explicit one within the pool is kept, above the model's lowered to
    /// it, above the pool refused with both byte counts; a pool without a block is refused.
    #[test]
    fn the_context_follows_the_pool_and_ctx_size() {
        assert_eq!(EngineConfig::block_bytes(&model(), 1), 256);
        let mut m = model();
        assert_eq!(fit_context(&mut m, None, &engine(1000, 16)), Ok(16_000));
        assert_eq!((m.max_len(), m.model_context()), (16_000, 1 << 20));
        let mut m = model();
        assert_eq!(fit_context(&mut m, Some(4096), &engine(1000, 16)), Ok(4096));
        let mut m = model();
        let whole = engine(1 << 17, 16);
        assert_eq!(fit_context(&mut m, Some(usize::MAX), &whole), Ok(1 << 20));
        let mut m = model();
        let err = fit_context(&mut m, Some(20_000), &engine(1000, 16)).unwrap_err();
        assert!(
            err.contains("--ctx-size 20000")
                && err.contains(&(20_000u64 * 256).to_string())
                && err.contains(&(16_000u64 * 256).to_string()),
            "{err}"
        );
        assert_eq!(m.max_len(), 1 << 20, "a refused context changes nothing");
        let err = fit_context(&mut model(), None, &engine(0, 16)).unwrap_err();
        assert!(err.contains("--kv-memory-mib"), "{err}");
    }
}
