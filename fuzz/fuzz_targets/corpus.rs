//! cargo fuzz target: TSV pairs and plain lines (text::corpus). A panic, or an error that does not name its file, is a finding.
#![no_main]

#[path = "../../tests/fuzz_common/mod.rs"]
mod fuzz_common;

use fuzz_common::readers;
use fuzz_common::seeds::{tempdir, Seeds};
use libfuzzer_sys::fuzz_target;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

fn seeds() -> &'static Seeds {
    static SEEDS: OnceLock<Seeds> = OnceLock::new();
    SEEDS.get_or_init(Seeds::build)
}

fn scratch() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(tempdir)
}

fuzz_target!(|data: &[u8]| {
    let _ = (seeds, scratch);
    let result = {
        readers::corpus(data)
    };
    if let Err(unclear) = result {
        panic!("{unclear}");
    }
});
