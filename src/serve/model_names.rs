//! Which served model a request's `model` names.
//!
//! With one model served, every name is answered by it, as llama-server does: tools and SDK
//! examples send fixed names (`gpt-3.5-turbo`, `text-embedding-3-small`) and a server of one
//! model has nothing else to give them. With several models, the name routes: a model answers
//! to any of its names, an absent `model` goes to the first, and an unknown name is a 404 that
//! lists every name served. `transformer serve` loads one model per process, so its table has
//! one entry today; the rule for several is here so that a server holding several (a language
//! model beside an embedder, say) routes by it.

use super::api_error::ApiError;

/// The names of each served model, in the order served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelNames {
    /// Per model: its names, the one responses use first.
    models: Vec<Vec<String>>,
}

impl ModelNames {
    /// A table of `models`, each a list of its names (the first is the name responses use).
    pub fn new(models: Vec<Vec<String>>) -> Self {
        ModelNames { models }
    }

    /// Every name served, in order.
    pub fn all(&self) -> Vec<String> {
        self.models.iter().flatten().cloned().collect()
    }

    /// The index of the model that answers a request naming `asked` (see the module docs).
    pub fn route(&self, asked: Option<&str>) -> Result<usize, ApiError> {
        let Some(asked) = asked else {
            return Ok(0);
        };
        if self.models.len() <= 1 {
            return Ok(0);
        }
        self.models
            .iter()
            .position(|names| names.iter().any(|n| n == asked))
            .ok_or_else(|| ApiError::model_not_found(asked, &self.all()))
    }

    /// Whether `id` is one of the names served (`GET /v1/models/{id}`: a lookup, not a
    /// request to answer, so unknown names are 404 even with one model).
    pub fn knows(&self, id: &str) -> bool {
        self.models.iter().flatten().any(|n| n == id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(models: &[&[&str]]) -> ModelNames {
        ModelNames::new(
            models
                .iter()
                .map(|m| m.iter().map(|n| n.to_string()).collect())
                .collect(),
        )
    }

    #[test]
    fn one_model_answers_every_name() {
        let one = names(&[&["smol", "smol.gguf"]]);
        for asked in [None, Some("smol"), Some("gpt-3.5-turbo"), Some("")] {
            assert_eq!(one.route(asked), Ok(0), "{asked:?}");
        }
        assert!(one.knows("smol.gguf"));
        assert!(!one.knows("gpt-3.5-turbo"));
    }

    #[test]
    fn several_models_route_by_name_and_refuse_unknown_names() {
        let two = names(&[&["smol", "smol.gguf"], &["minilm"]]);
        assert_eq!(two.route(None), Ok(0));
        assert_eq!(two.route(Some("smol.gguf")), Ok(0));
        assert_eq!(two.route(Some("minilm")), Ok(1));
        let e = two.route(Some("gpt-4o")).unwrap_err();
        assert_eq!(e.status, axum::http::StatusCode::NOT_FOUND);
        assert_eq!((e.code, e.param), ("model_not_found", Some("model")));
        for name in ["`smol`", "`smol.gguf`", "`minilm`", "`gpt-4o`"] {
            assert!(e.message.contains(name), "{}", e.message);
        }
        assert_eq!(e.body()["error"]["type"], "not_found_error");
    }
}
