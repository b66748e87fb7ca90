//! `transformer prune --model M (--heads N | --keep FRACTION) [--by importance|random] --out M2`:
//! removes attention heads physically (Michel et al. 2019), the least important first (their
//! importance measured on `--data`) or in a random order, optionally fine-tunes the pruned
//! model on `--data` (`--fine-tune-steps`: text for a language model, sentence pairs for a
//! translation model), and writes the smaller model. A pretrained
//! decoder (a Hugging Face directory or a GGUF file, dequantised to float32) is written in this
//! crate's format with its own tokenizer (`crate::pipeline::lm_dir`).

use super::args::ThreadsArgs;
use crate::heads::fine_tune::{fine_tune_lm, fine_tune_seq2seq, FineTune};
use crate::heads::prune::{choose, prune, removable, Order};
use crate::heads::run::{encoded_pairs, lm_windows, measure, DataSize, HeadsModel};
use crate::heads::HeadModel;
use crate::model::checkpoint::write_model;
use crate::pipeline::lm_dir::tokenizer_files;
use crate::store::{CheckpointWriter, TOKENIZER_FILE, TRAINER_STATE_FILE, VOCAB_FILE};
use crate::train::pairs::TrainConfig;
use crate::train::state::TrainerState;
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use std::path::PathBuf;

/// The order in which heads go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum By {
    /// Lowest normalised importance on --data first, over all layers and sites at once.
    Importance,
    /// A random order drawn from --seed.
    Random,
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("how_many").required(true).args(["heads", "keep"])))]
pub struct PruneArgs {
    /// A model directory of train or train-lm, a Hugging Face decoder directory or a GGUF file.
    #[arg(long)]
    pub model: PathBuf,
    /// Query heads to remove (a multiple of the key/value group size).
    #[arg(long)]
    pub heads: Option<usize>,
    /// The fraction of the heads to keep, in (0, 1] (rounded down to whole groups removed).
    #[arg(long)]
    pub keep: Option<f64>,
    #[arg(long, value_enum, default_value_t = By::Importance)]
    pub by: By,
    /// The random order's seed (--by random), and the order of the fine-tune's windows.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The data the importance is measured on (--by importance): UTF-8 text for a language
    /// model, lines of a source, a tab and a target for a translation model.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Batches of --data read.
    #[arg(long, default_value_t = 8)]
    pub batches: usize,
    /// Windows or sentence pairs per batch.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Tokens per language-model window.
    #[arg(long, default_value_t = 128)]
    pub context: usize,
    /// Fine-tune the pruned model for this many updates on --fine-tune-data, else --data (Adam
    /// from fresh moments, --batch windows of --context tokens or --batch sentence pairs an
    /// update, no dropout).
    #[arg(long, default_value_t = 0)]
    pub fine_tune_steps: usize,
    /// The fine-tune's constant learning rate.
    #[arg(long, default_value_t = 1e-4)]
    pub lr: f64,
    /// What the fine-tune trains on, when not --data (which then only measures the
    /// importance): text for a language model, sentence pairs for a translation model.
    #[arg(long)]
    pub fine_tune_data: Option<PathBuf>,
    /// A translation model's fine-tune: ε_ls of the label-smoothed loss (default: the model's
    /// own recipe in trainer_state.json, else the paper's 0.1).
    #[arg(long)]
    pub label_smoothing: Option<f64>,
    /// The pruned model's directory (must not exist).
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub pool: ThreadsArgs,
}

pub fn run(args: PruneArgs) -> Result<()> {
    if args.out.exists() {
        bail!(
            "--out {} exists: give a new directory for the pruned model",
            args.out.display()
        );
    }
    if let Some(keep) = args.keep {
        if !(keep > 0.0 && keep <= 1.0) {
            bail!("--keep {keep}: the fraction of heads kept must be in (0, 1]");
        }
    }
    if args.by == By::Importance && args.data.is_none() {
        bail!("--by importance needs --data (the text or pairs the importance is measured on)");
    }
    let fine_tune_data = args.fine_tune_data.as_ref().or(args.data.as_ref());
    if args.fine_tune_steps > 0 && fine_tune_data.is_none() {
        bail!(
            "--fine-tune-steps needs --data or --fine-tune-data (what the pruned model is \
             fine-tuned on)"
        );
    }
    for (given, flag) in [
        (args.label_smoothing.is_some(), "--label-smoothing"),
        (args.fine_tune_data.is_some(), "--fine-tune-data"),
    ] {
        if given && args.fine_tune_steps == 0 {
            bail!("{flag} applies to the fine-tune: give --fine-tune-steps N too");
        }
    }
    let mut model = HeadsModel::load(&args.model)?;
    if args.label_smoothing.is_some() && matches!(model, HeadsModel::Lm(_)) {
        bail!(
            "--label-smoothing applies to a translation model; a language model is fine-tuned \
             on the plain next-token loss"
        );
    }
    let order = match (&args.by, &args.data) {
        (By::Importance, Some(data)) => {
            let size = DataSize {
                batches: args.batches,
                batch: args.batch,
                context: args.context,
            };
            let (importance, _) = measure(&mut model, data, size)?;
            Order::Importance(importance.normalised())
        }
        _ => Order::Random(args.seed),
    };
    let heads_model: &mut dyn PruneTarget = match &mut model {
        HeadsModel::Lm(g) => &mut g.model,
        HeadsModel::Translation(t) => &mut t.model,
    };
    let (total, group) = heads_model.counts();
    let n = match (args.heads, args.keep) {
        (Some(n), _) => n,
        (None, Some(keep)) => {
            let remove = ((1.0 - keep) * total as f64).round() as usize;
            remove / group * group
        }
        (None, None) => unreachable!("clap requires --heads or --keep"),
    };
    heads_model.prune_n(n, &order)?;
    if let (Some(data), true) = (fine_tune_data, args.fine_tune_steps > 0) {
        fine_tune_pruned(&mut model, data, &args)?;
    }
    // The tokenizer files go into the same all-or-nothing save, listed in its manifest.
    let extra = match &model {
        HeadsModel::Lm(g) => tokenizer_files(&args.model, g.source)?,
        HeadsModel::Translation(_) => {
            let mut extra = Vec::new();
            for file in [VOCAB_FILE, TOKENIZER_FILE] {
                let from = args.model.join(file);
                if from.is_file() {
                    let bytes = std::fs::read(&from)
                        .with_context(|| format!("reading {}", from.display()))?;
                    extra.push((file.to_string(), bytes));
                }
            }
            extra
        }
    };
    let heads_model: &mut dyn PruneTarget = match &mut model {
        HeadsModel::Lm(g) => &mut g.model,
        HeadsModel::Translation(t) => &mut t.model,
    };
    heads_model.save_to(&args.out, &extra)?;
    eprintln!(
        "removed {n} of {total} heads ({}); per layer: {}; wrote {}",
        match args.by {
            By::Importance => "least important first".to_string(),
            By::Random => format!("random order, seed {}", args.seed),
        },
        heads_model.layer_counts(),
        args.out.display()
    );
    Ok(())
}

/// Fine-tunes the pruned `model` on `data` as `args` say, and reports the first and last
/// update's loss.
fn fine_tune_pruned(
    model: &mut HeadsModel,
    data: &std::path::Path,
    args: &PruneArgs,
) -> Result<()> {
    let plan = FineTune {
        steps: args.fine_tune_steps,
        batch: args.batch,
        lr: args.lr,
        seed: args.seed,
    };
    let examples = plan.steps * plan.batch;
    let (losses, what) = match model {
        HeadsModel::Lm(g) => {
            let context = args.context.min(g.model.max_len() - 1).max(1);
            let windows = lm_windows(g, data, context, examples)?;
            let losses = fine_tune_lm(&mut g.model, &windows, plan)?;
            let what = format!("windows of {context} tokens ({} distinct)", windows.len());
            (losses, what)
        }
        HeadsModel::Translation(t) => {
            let pairs = encoded_pairs(t, data, examples)?;
            let smoothing = match args.label_smoothing {
                Some(e) => e,
                None if args.model.join(TRAINER_STATE_FILE).is_file() => {
                    TrainerState::<TrainConfig>::load(&args.model)?
                        .config
                        .label_smoothing
                }
                None => 0.1,
            };
            let losses = fine_tune_seq2seq(&mut t.model, &pairs, plan, smoothing)?;
            let what = format!(
                "sentence pairs ({} distinct), label smoothing {smoothing}",
                pairs.len()
            );
            (losses, what)
        }
    };
    eprintln!(
        "fine-tuned {} updates of {} {what}, lr {}: loss {:.4} at the first update, {:.4} at \
         the last",
        plan.steps,
        plan.batch,
        plan.lr,
        losses.first().copied().unwrap_or(f64::NAN),
        losses.last().copied().unwrap_or(f64::NAN)
    );
    Ok(())
}

/// What prune does with either kind of model.
trait PruneTarget {
    /// The query heads, and the key/value group size.
    fn counts(&self) -> (usize, usize);
    /// Removes `n` heads in `order`.
    fn prune_n(&mut self, n: usize, order: &Order) -> crate::error::Result<()>;
    /// Saves config.json, the weights and the files `extra` (name, bytes) to `dir`, all or
    /// nothing.
    fn save_to(
        &mut self,
        dir: &std::path::Path,
        extra: &[(String, Vec<u8>)],
    ) -> crate::error::Result<()>;
    /// The heads per layer and site, for the summary.
    fn layer_counts(&self) -> String;
}

impl<M> PruneTarget for M
where
    M: HeadModel<f32> + crate::model::Model<Config = crate::model::ModelConfig>,
{
    fn counts(&self) -> (usize, usize) {
        let config = self.config();
        (
            removable(self).0,
            config.n_heads / config.n_kv_heads.unwrap_or(config.n_heads),
        )
    }
    fn prune_n(&mut self, n: usize, order: &Order) -> crate::error::Result<()> {
        let remove = choose(self, n, order)?;
        prune(self, &remove)
    }
    fn save_to(
        &mut self,
        dir: &std::path::Path,
        extra: &[(String, Vec<u8>)],
    ) -> crate::error::Result<()> {
        let mut writer = CheckpointWriter::begin(dir)?;
        write_model(&mut writer, self)?;
        for (name, bytes) in extra {
            writer.add(name, bytes)?;
        }
        writer.commit()
    }
    fn layer_counts(&self) -> String {
        let mut parts = Vec::new();
        for site in self.sites() {
            let heads: Vec<String> = self
                .attentions()
                .iter()
                .filter(|(s, _, _)| s == site)
                .map(|(_, _, a)| a.n_heads.to_string())
                .collect();
            parts.push(format!("{} [{}]", site.name(), heads.join(" ")));
        }
        parts.join(", ")
    }
}
