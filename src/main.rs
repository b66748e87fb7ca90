//! `transformer`: train, run and measure the Transformer from the command line. Thin: parse the
//! command line, call the library, map errors to a message and a nonzero exit.

use clap::Parser;

fn main() {
    let cli = transformer::cli::Cli::parse();
    if let Err(e) = transformer::cli::run(cli) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
