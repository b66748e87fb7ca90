//! Translate a text file, one sentence a line, with a model directory written by
//! `transformer train` (or `transformer demo --out DIR`):
//!
//! ```sh
//! cargo run --release --example translate_file -- MODEL_DIR input.txt [BEAM]
//! ```
//!
//! Greedy search by default; beam search of width BEAM (length penalty α = 0.6, the paper's)
//! when given. Builds with `--no-default-features`: it uses only the library's pipeline.

use std::path::PathBuf;
use transformer::{BeamOptions, Translator};

fn main() {
    // The library's errors name the file or value at fault: print them as they read.
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(model), Some(input)) = (args.first(), args.get(1)) else {
        return Err("usage: translate_file MODEL_DIR INPUT.txt [BEAM]".into());
    };
    let beam_size: usize = match args.get(2) {
        Some(b) => b
            .parse()
            .map_err(|_| format!("BEAM {b:?} is not a number"))?,
        None => 1,
    };
    let mut translator = Translator::load(&PathBuf::from(model))?;
    translator.prepare_inference();
    let text = std::fs::read_to_string(input).map_err(|e| format!("cannot read {input}: {e}"))?;
    let lines: Vec<String> = text.lines().map(str::to_string).collect();
    let options = BeamOptions {
        beam_size: beam_size.max(1),
        ..BeamOptions::default()
    };
    // One n-best list per line (empty lines get none), best first.
    for list in translator.translate_nbest(&lines, &options)? {
        println!("{}", list.first().map_or("", |(_, text)| text.as_str()));
    }
    Ok(())
}
