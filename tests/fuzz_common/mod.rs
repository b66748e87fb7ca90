//! Fuzzing of every reader: seed files ([`seeds`]), their mutations ([`mutate`]) and the
//! readers run on them ([`readers`]).
#![allow(dead_code)]

pub mod mutate;
pub mod readers;
pub mod seeds;
