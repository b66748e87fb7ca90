//! Python's `None` as transformers passes it for an absent `tools` or `documents`.
//!
//! minijinja's `none` iterates as an empty sequence; Python's refuses (`TypeError: 'NoneType'
//! object is not iterable`), and so do the templates (Hermes, Command R) that loop over `tools`
//! without checking it. This object is false, prints `None`, is `none` to the `none` test and
//! `null` to `tojson`, and has neither items nor a length.

use minijinja::value::{Object, ObjectRepr, Value};
use std::fmt;
use std::sync::Arc;

/// The value; see the module.
#[derive(Debug)]
pub struct PythonNone;

impl Object for PythonNone {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Plain
    }

    fn is_true(self: &Arc<Self>) -> bool {
        false
    }

    fn render(self: &Arc<Self>, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("None")
    }
}

/// A new Python `None`.
pub fn python_none() -> Value {
    Value::from_object(PythonNone)
}

/// Whether `value` is `None` in Python's sense: minijinja's `none` or [`PythonNone`].
pub fn is_none(value: &Value) -> bool {
    value.is_none() || value.downcast_object_ref::<PythonNone>().is_some()
}
