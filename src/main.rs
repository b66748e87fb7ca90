//! `transformer`: train, run and measure the Transformer from the command line. Thin: parse the
//! command line, call the library, map errors to a message and a nonzero exit.

use clap::Parser;

fn main() {
    // SAFETY: the first statement of main, before any other thread exists.
    unsafe {
        transformer::cli::keep_freed_buffers();
    }
    let cli = transformer::cli::Cli::parse();
    if let Err(e) = transformer::cli::run(cli) {
        if transformer::cli::is_broken_pipe(&e) {
            // The reader of stdout closed it (`| head`): it has what it wanted.
            std::process::exit(0);
        }
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
