//! Generated data sets, so the project runs with no download.

pub mod numbers;
