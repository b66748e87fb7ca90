//! Text in and out: vocabularies and corpus reading with line-numbered errors.
