//! The further translation models of `serve --model A --model B …`: each one loaded, given its
//! own engine on its own compute thread (sharing the rayon pool), and routed by the languages
//! it translates (see `translate_routes`). The first model's engine is the one `compute` runs.

use super::model_kind;
use crate::kernels::lowp::Precision;
use crate::pipeline::translate::Translator;
use crate::serve::jobs::{self, Job, JobModel};
use crate::serve::translate_api::LanguageTable;
use crate::serve::translate_engine::TranslateConfig;
use crate::serve::translate_routes::{ModelLanguages, RoutedModel, Routes};
use crate::serve::App;
use crate::text::languages::LanguagePair;
use std::path::Path;
use std::sync::mpsc::Sender;
use std::sync::Arc;

/// The file name of `path`, for messages.
fn name_of(path: &Path) -> String {
    path.file_name()
        .unwrap_or(path.as_os_str())
        .to_string_lossy()
        .into_owned()
}

/// Loads every model of `app.config.more_models` and starts its engine; the routes of all of
/// them, the first model (`first_table`, its queue `first_jobs`) first. An error names the model
/// and what is wrong (not a translation model, no language pair, a load failure).
pub(super) fn start(
    app: &App,
    first_table: &Option<Arc<LanguageTable>>,
    first_jobs: &Sender<Job>,
    precision: Precision,
    config: TranslateConfig,
) -> Result<Routes, String> {
    let c = &app.config;
    let first = match first_table {
        Some(table) => ModelLanguages::Many(table.clone()),
        None if c.source_lang == "src" && c.target_lang == "tgt" => {
            return Err(format!(
                "{}: the model names no language pair (languages.json, or Marian's \
                 tokenizer_config.json); with several --model each must (--source-lang and \
                 --target-lang name the first one's)",
                c.model.display()
            ))
        }
        None => ModelLanguages::Pair {
            source: c.source_lang.clone(),
            target: c.target_lang.clone(),
        },
    };
    let mut models = vec![RoutedModel {
        name: name_of(&c.model),
        jobs: first_jobs.clone(),
        languages: first,
    }];
    for (i, path) in c.more_models.iter().enumerate() {
        let at = |e: String| format!("{}: {e}", path.display());
        if model_kind(path) != "translation" {
            return Err(at(
                "not a translation model (several --model serve translation models only)".into(),
            ));
        }
        let mut translator = Translator::load(path).map_err(|e| at(e.to_string()))?;
        translator
            .prepare_precision(precision)
            .map_err(|e| at(e.to_string()))?;
        let languages = match LanguageTable::of(&translator, "src", "tgt") {
            Ok(Some(table)) => ModelLanguages::Many(Arc::new(table)),
            Ok(None) => match (translator.pair.clone())
                .map_or_else(|| LanguagePair::read(path), |p| Ok(Some(p)))
                .map_err(|e| at(e.to_string()))?
            {
                Some(pair) => ModelLanguages::Pair {
                    source: pair.source,
                    target: pair.target,
                },
                None => {
                    return Err(at(
                        "the model names no language pair (languages.json, an Argos package's \
                         metadata.json, or Marian's tokenizer_config.json source_lang / \
                         target_lang)"
                            .into(),
                    ))
                }
            },
            Err(e) => return Err(at(e.to_string())),
        };
        let (jobs, queue) = std::sync::mpsc::channel();
        let metrics = app.metrics.clone();
        let model = JobModel::Translator(Box::new(translator));
        std::thread::Builder::new()
            .name(format!("compute-{}", i + 1))
            .spawn(move || jobs::run(&model, queue, &metrics, config))
            .map_err(|e| at(format!("cannot start its compute thread: {e}")))?;
        models.push(RoutedModel {
            name: name_of(path),
            jobs,
            languages,
        });
    }
    Ok(Routes::new(models))
}
