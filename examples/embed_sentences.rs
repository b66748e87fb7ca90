//! Sentence embeddings with a pretrained encoder (all-MiniLM-L6-v2 in ../shared by default)
//! and the cosine similarity of every pair:
//!
//! ```sh
//! cargo run --release --example embed_sentences -- ../shared/models/all-MiniLM-L6-v2 \
//!     "The cat sits on the mat." "A cat is sitting on a rug." "Stock markets fell today."
//! ```
//!
//! Builds with `--no-default-features`.

use std::path::PathBuf;
use transformer::SentenceEncoder;

fn main() {
    // The library's errors name the file or value at fault: print them as they read.
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let model = PathBuf::from(
        args.next()
            .unwrap_or_else(|| "../shared/models/all-MiniLM-L6-v2".into()),
    );
    let mut sentences: Vec<String> = args.collect();
    if sentences.is_empty() {
        sentences = vec![
            "The cat sits on the mat.".into(),
            "A cat is sitting on a rug.".into(),
            "Stock markets fell sharply today.".into(),
        ];
    }
    let encoder = SentenceEncoder::load(&model, None)?;
    // [n][d], each of unit length: a dot product is the cosine similarity.
    let vectors = encoder.embed(&sentences, 32)?;
    println!(
        "{} sentences, {} dimensions",
        vectors.len(),
        vectors[0].len()
    );
    for (i, a) in vectors.iter().enumerate() {
        for (j, b) in vectors.iter().enumerate().skip(i + 1) {
            let cosine: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
            println!("{cosine:.4}  {:?} ~ {:?}", sentences[i], sentences[j]);
        }
    }
    Ok(())
}
