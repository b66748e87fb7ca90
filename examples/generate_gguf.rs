//! Chat with a GGUF model, the reply streamed as it is sampled:
//!
//! ```sh
//! cargo run --release --example generate_gguf -- \
//!     ../shared/models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf "What is the capital of France?"
//! ```
//!
//! The question goes through the model's own chat template (read from the GGUF metadata);
//! the reply is greedy and ends at the end-of-turn token. A model without a chat template
//! continues the text instead. Builds with `--no-default-features`.

use std::io::Write;
use std::path::PathBuf;
use transformer::prelude::*;

fn main() {
    // The library's errors name the file or value at fault: print them as they read.
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = PathBuf::from(args.next().unwrap_or_else(|| {
        "../shared/models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf".into()
    }));
    let question = args
        .next()
        .unwrap_or_else(|| "What is the capital of France?".into());
    // Float32 weights (dequantised at load); ModelPrecision::Ggml multiplies the stored
    // 4-bit blocks as llama.cpp does.
    let generator = TextGenerator::load_prepared(&path, ModelPrecision::F32)?;
    let prompt = match generator.chat {
        Some(_) => generator.chat_prompt(&[ChatMessage::new("user", &question)])?,
        None => generator.tokenizer.document(&question)?,
    };
    let until = generator.tokenizer.end_tokens();
    let greedy = SamplingOptions {
        temperature: 0.0,
        ..SamplingOptions::default()
    };
    let mut decoder = StreamDecoder::new(&generator.tokenizer);
    let mut stdout = std::io::stdout().lock();
    generate_ids(
        &generator.model,
        &prompt,
        128,
        greedy,
        &mut Rng::new(1),
        &until,
        |id| -> Result<(), Box<dyn std::error::Error>> {
            if !until.contains(&id) {
                stdout.write_all(decoder.push(id)?.as_bytes())?;
                stdout.flush()?;
            }
            Ok(())
        },
    )?;
    writeln!(stdout, "{}", decoder.finish()?)?;
    Ok(())
}
